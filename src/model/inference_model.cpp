#include "model/inference_model.h"

#include <vector>

#include "core/error.h"
#include "ops/lowp_convert.h"

namespace jtok {

int64_t token_table_count(const ModelConfig& cfg) {
  return cfg.jtok_num_layers() + cfg.jtokm_num_layers() * cfg.jtokm_n_e;
}

int64_t table_bytes(const ModelConfig& cfg, Dtype dt) {
  if (dt != Dtype::f32 && dt != Dtype::bf16) fail("table_bytes: f32 or bf16, got ", dtype_name(dt));
  return token_table_count(cfg) * cfg.padded_vocab() * cfg.hidden_size * dtype_bytes(dt);
}

// Table k of m from its init stream (make_model's values, row by row), stored as dt.
static TokenTable init_table(const Model& m, uint64_t seed, int64_t k, Dtype dt) {
  const int64_t rows = m.cfg.padded_vocab(), d = m.cfg.hidden_size;
  TableInitStream init(m, seed, k);
  if (dt == Dtype::f32) {
    std::vector<float> values(static_cast<size_t>(rows * d));
    for (int64_t r = 0; r < rows; ++r) init.next(values.data() + r * d);
    return TokenTable::in_ram(rows, d, std::move(values));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * d * 2));
  std::vector<float> row(static_cast<size_t>(d));
  auto* out = reinterpret_cast<uint16_t*>(bytes.data());
  for (int64_t r = 0; r < rows; ++r) {
    init.next(row.data());
    quantize_bf16(out + r * d, row.data(), d);
  }
  return TokenTable::quantized_in_ram(rows, d, Dtype::bf16, std::move(bytes), {});
}

Model make_inference_model_without_tables(const ModelConfig& cfg, uint64_t seed) {
  // The backbone as make_model makes it; the tables' shapes and init streams, no storage.
  Model m = make_model(cfg, seed, {.init = true, .grads = false, .tables = false});
  // Inference reads the tables only: no row gradients (make_model sizes a V-slot map per table).
  for (SparseRowGrad& g : m.table_grads) g = SparseRowGrad{};
  return m;
}

Model make_inference_model(const ModelConfig& cfg, uint64_t seed, Dtype table_dtype) {
  if (table_dtype != Dtype::f32 && table_dtype != Dtype::bf16)
    fail("a random model's tables are f32 or bf16, not ", dtype_name(table_dtype));
  Model m = make_inference_model_without_tables(cfg, seed);
  const int64_t n = static_cast<int64_t>(m.tables.size());
  // Each table its own stream: side by side, the same bits as one after another.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t k = 0; k < n; ++k) m.tables[static_cast<size_t>(k)] = init_table(m, seed, k, table_dtype);
  return m;
}

}  // namespace jtok
