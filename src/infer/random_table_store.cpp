#include "infer/random_table_store.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "ops/lowp_convert.h"
#include "store/table_store.h"

namespace jtok {

namespace {

// Rows [first, first + count) of every table, (count, tables, d) in dt, each table's stream advanced
// by count rows. The tables side by side: each stream is its own, so the bits are the same in any order.
class RandomRowChunks {
 public:
  RandomRowChunks(const Model& m, uint64_t seed, Dtype dt, int64_t chunk)
      : n_(static_cast<int64_t>(m.tables.size())),
        d_(m.cfg.hidden_size),
        rows_(m.cfg.padded_vocab()),
        chunk_(chunk),
        dt_(dt),
        row_bytes_(m.cfg.hidden_size * dtype_bytes(dt)),
        buf_(static_cast<size_t>(chunk * n_ * row_bytes_)) {
    for (int64_t k = 0; k < n_; ++k) streams_.emplace_back(m, seed, k);
  }

  // Table k's row of id (ids asked in ascending order, as the store writer asks them).
  const uint8_t* row(int64_t id, int64_t k) {
    if (first_ < 0 || id >= first_ + chunk_) fill(first_ < 0 ? 0 : first_ + chunk_);
    JTOK_CHECK(id >= first_ && id < first_ + chunk_, "random table store: id ", id, " asked out of order");
    return buf_.data() + ((id - first_) * n_ + k) * row_bytes_;
  }
  int64_t row_bytes() const { return row_bytes_; }

 private:
  void fill(int64_t from) {
    const int64_t count = std::min(chunk_, rows_ - from);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t k = 0; k < n_; ++k) {
      std::vector<float> values(static_cast<size_t>(d_));
      for (int64_t r = 0; r < count; ++r) {
        streams_[static_cast<size_t>(k)].next(values.data());
        uint8_t* out = buf_.data() + (r * n_ + k) * row_bytes_;
        if (dt_ == Dtype::f32)
          std::memcpy(out, values.data(), static_cast<size_t>(row_bytes_));
        else
          quantize_bf16(reinterpret_cast<uint16_t*>(out), values.data(), d_);
      }
    }
    first_ = from;
  }

  int64_t n_, d_, rows_, chunk_;
  Dtype dt_;
  int64_t row_bytes_;
  std::vector<TableInitStream> streams_;
  std::vector<uint8_t> buf_;
  int64_t first_ = -1;
};

}  // namespace

int64_t write_random_table_store(const Model& m, uint64_t seed, Dtype dt, const std::string& dir) {
  if (dt != Dtype::f32 && dt != Dtype::bf16) fail("a random table store holds f32 or bf16 rows, not ", dtype_name(dt));
  if (m.tables.empty()) fail("random table store ", dir, ": the model has no token tables (set jtok or jtokm)");
  std::vector<TableStoreSpec> specs;
  for (const std::string& name : m.table_names) specs.push_back({name, m.cfg.hidden_size, dt});
  RandomRowChunks rows(m, seed, dt, 256);
  TableStoreSource source;
  source.checkpoint = "random (seed " + std::to_string(seed) + ")";
  write_table_store(
      dir, m.cfg.padded_vocab(), specs,
      [&](int64_t id, int64_t k, void* raw, float*) {
        std::memcpy(raw, rows.row(id, k), static_cast<size_t>(rows.row_bytes()));
      },
      source);
  return static_cast<int64_t>(std::filesystem::file_size(std::filesystem::path(dir) / "tables.bin"));
}

}  // namespace jtok
