#include "infer/random_table_store.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <future>
#include <vector>

#include "core/error.h"
#include "ops/lowp_convert.h"
#include "store/table_store.h"

namespace jtok {

namespace {

// Rows [first, first + count) of every table, (count, tables, d) in dt, each table's stream advanced
// by count rows. The tables side by side: each stream is its own, so the bits are the same in any order.
// Two chunks: the next one is made on a worker while the writer copies rows out of this one, so the
// store takes the longer of making and writing, not their sum.
class RandomRowChunks {
 public:
  RandomRowChunks(const Model& m, uint64_t seed, Dtype dt, TableValues values, int64_t chunk)
      : m_(m),
        seed_(seed),
        values_(values),
        n_(static_cast<int64_t>(m.tables.size())),
        d_(m.cfg.hidden_size),
        rows_(m.cfg.padded_vocab()),
        chunk_(chunk),
        dt_(dt),
        row_bytes_(m.cfg.hidden_size * dtype_bytes(dt)) {
    for (auto& b : buf_) b.resize(static_cast<size_t>(chunk * n_ * row_bytes_));
    if (values == TableValues::init)
      for (int64_t k = 0; k < n_; ++k) streams_.emplace_back(m, seed, k);
    fill(buf_[0], 0, std::min(chunk_, rows_));
    start_next();
  }
  ~RandomRowChunks() {
    if (next_.valid()) next_.wait();  // the worker writes into buf_ and streams_: done before they go
  }

  // Table k's row of id (ids asked in ascending order, as the store writer asks them).
  const uint8_t* row(int64_t id, int64_t k) {
    if (id >= first_ + chunk_ && next_.valid()) {
      next_.get();  // rethrows the worker's failure
      std::swap(buf_[0], buf_[1]);
      first_ += chunk_;
      start_next();
    }
    JTOK_CHECK(id >= first_ && id < first_ + chunk_, "random table store: id ", id, " asked out of order");
    return buf_[0].data() + ((id - first_) * n_ + k) * row_bytes_;
  }
  int64_t row_bytes() const { return row_bytes_; }

 private:
  // The chunk after first_'s into buf_[1], on a worker (none past the last row).
  void start_next() {
    const int64_t from = first_ + chunk_;
    if (from >= rows_) return;
    next_ = std::async(std::launch::async, [this, from] { fill(buf_[1], from, std::min(chunk_, rows_ - from)); });
  }
  // Rows [from, from + count) into out: the streams' next count rows, or the hash's.
  void fill(std::vector<uint8_t>& out, int64_t from, int64_t count) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t k = 0; k < n_; ++k) {
      std::vector<float> values(static_cast<size_t>(d_));
      for (int64_t r = 0; r < count; ++r) {
        if (values_ == TableValues::init)
          streams_[static_cast<size_t>(k)].next(values.data());
        else
          hash_table_row(m_, seed_, k, from + r, values.data());
        uint8_t* at = out.data() + (r * n_ + k) * row_bytes_;
        if (dt_ == Dtype::f32)
          std::memcpy(at, values.data(), static_cast<size_t>(row_bytes_));
        else
          quantize_bf16_row(reinterpret_cast<uint16_t*>(at), values.data(), d_);
      }
    }
  }

  const Model& m_;
  uint64_t seed_;
  TableValues values_;
  int64_t n_, d_, rows_, chunk_;
  Dtype dt_;
  int64_t row_bytes_;
  std::vector<TableInitStream> streams_;
  std::vector<uint8_t> buf_[2];  // [0]: rows first_.., [1]: the chunk after, while next_ makes it
  int64_t first_ = 0;
  std::future<void> next_;
};

}  // namespace

int64_t write_random_table_store(const Model& m, uint64_t seed, Dtype dt, const std::string& dir, TableValues values) {
  if (dt != Dtype::f32 && dt != Dtype::bf16) fail("a random table store holds f32 or bf16 rows, not ", dtype_name(dt));
  if (m.tables.empty()) fail("random table store ", dir, ": the model has no token tables (set jtok or jtokm)");
  std::vector<TableStoreSpec> specs;
  for (const std::string& name : m.table_names) specs.push_back({name, m.cfg.hidden_size, dt});
  RandomRowChunks rows(m, seed, dt, values, 256);
  TableStoreSource source;
  source.random = "seed " + std::to_string(seed) + ", table values " + table_values_name(values);
  write_table_store(
      dir, m.cfg.padded_vocab(), specs,
      [&](int64_t id, int64_t k, void* raw, float*) {
        std::memcpy(raw, rows.row(id, k), static_cast<size_t>(rows.row_bytes()));
      },
      source);
  return static_cast<int64_t>(std::filesystem::file_size(std::filesystem::path(dir) / "tables.bin"));
}

}  // namespace jtok
