#include "model/inference_model.h"

#include <algorithm>
#include <cmath>
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

TableValues parse_table_values(const std::string& s, const char* flag) {
  if (s == "init") return TableValues::init;
  if (s == "hash") return TableValues::hash;
  fail(flag, " must be init or hash, got '", s, "'");
}

const char* table_values_name(TableValues v) { return v == TableValues::init ? "init" : "hash"; }

// splitmix64's output mix: a bijection of 64-bit words whose every output bit depends on every input bit.
static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void hash_table_row(const Model& m, uint64_t seed, int64_t k, int64_t id, float* out) {
  const int64_t d = m.cfg.hidden_size;
  if (id >= m.cfg.vocab_size) {
    std::fill(out, out + d, 0.0f);
    return;
  }
  const Model::TableInit& t = m.table_init.at(static_cast<size_t>(k));
  const uint64_t key = mix64(seed * 1000003ULL + t.stream), golden = 0x9e3779b97f4a7c15ULL;
  // Four uniforms on {0..65535}: mean 131070, variance 4 (65536^2 - 1) / 12.
  const float scale = static_cast<float>(t.std / std::sqrt((65536.0 * 65536.0 - 1.0) / 3.0));
  const uint64_t first = static_cast<uint64_t>(id * d);
  for (int64_t c = 0; c < d; ++c) {
    const uint64_t b = mix64(key + (first + static_cast<uint64_t>(c) + 1) * golden);
    const int32_t sum = static_cast<int32_t>((b & 0xffff) + ((b >> 16) & 0xffff) + ((b >> 32) & 0xffff) + (b >> 48));
    out[c] = static_cast<float>(sum - 131070) * scale;
  }
}

// Table k of m from the hash, stored as dt, its rows made in parallel.
static TokenTable hash_table(const Model& m, uint64_t seed, int64_t k, Dtype dt) {
  const int64_t rows = m.cfg.padded_vocab(), d = m.cfg.hidden_size;
  if (dt == Dtype::f32) {
    std::vector<float> values(static_cast<size_t>(rows * d));
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) hash_table_row(m, seed, k, r, values.data() + r * d);
    return TokenTable::in_ram(rows, d, std::move(values));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * d * 2));
  auto* out = reinterpret_cast<uint16_t*>(bytes.data());
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(d));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      hash_table_row(m, seed, k, r, row.data());
      quantize_bf16_row(out + r * d, row.data(), d);
    }
  }
  return TokenTable::quantized_in_ram(rows, d, Dtype::bf16, std::move(bytes), {});
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

Model make_inference_model(const ModelConfig& cfg, uint64_t seed, Dtype table_dtype, TableValues values) {
  if (table_dtype != Dtype::f32 && table_dtype != Dtype::bf16)
    fail("a random model's tables are f32 or bf16, not ", dtype_name(table_dtype));
  Model m = make_inference_model_without_tables(cfg, seed);
  const int64_t n = static_cast<int64_t>(m.tables.size());
  if (values == TableValues::hash) {
    for (int64_t k = 0; k < n; ++k) m.tables[static_cast<size_t>(k)] = hash_table(m, seed, k, table_dtype);
    return m;
  }
  // Each table its own stream: side by side, the same bits as one after another.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t k = 0; k < n; ++k) m.tables[static_cast<size_t>(k)] = init_table(m, seed, k, table_dtype);
  return m;
}

}  // namespace jtok
