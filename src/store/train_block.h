// The one definition of a training store's row (docs/formats.md "Training table store"): in a
// token's block, each table's part is its value (dim f32), exp_avg (dim f32), exp_avg_sq (dim f32)
// and row_step (int32: the optimizer steps the row has had), in that order, little-endian, with no
// padding. The writer (create), the cache (load_row, store_row), the manifest's check and the export
// of a checkpoint's tables (train/store_export.cpp) all go through it. What the fields mean (AdamW)
// is the trainer's (train/table_optimizer.h); the store keeps bytes.
#pragma once
#include <cstdint>
#include <cstring>

namespace jtok {

struct TrainRowLayout {
  int64_t dim = 0;
  // Byte offsets of the fields in the row, and the row's bytes.
  int64_t value() const { return 0; }
  int64_t exp_avg() const { return value() + 4 * dim; }
  int64_t exp_avg_sq() const { return exp_avg() + 4 * dim; }
  int64_t row_step() const { return exp_avg_sq() + 4 * dim; }
  int64_t bytes() const { return row_step() + 4; }

  // The row at b into p, m, v (dim each) and *step.
  void read(const uint8_t* b, float* p, float* m, float* v, int32_t* step) const {
    std::memcpy(p, b + value(), static_cast<size_t>(4 * dim));
    std::memcpy(m, b + exp_avg(), static_cast<size_t>(4 * dim));
    std::memcpy(v, b + exp_avg_sq(), static_cast<size_t>(4 * dim));
    std::memcpy(step, b + row_step(), 4);
  }
  void write(uint8_t* b, const float* p, const float* m, const float* v, int32_t step) const {
    std::memcpy(b + value(), p, static_cast<size_t>(4 * dim));
    std::memcpy(b + exp_avg(), m, static_cast<size_t>(4 * dim));
    std::memcpy(b + exp_avg_sq(), v, static_cast<size_t>(4 * dim));
    std::memcpy(b + row_step(), &step, 4);
  }
  void read_value(const uint8_t* b, float* p) const { std::memcpy(p, b + value(), static_cast<size_t>(4 * dim)); }
  float* value_at(uint8_t* b) const { return reinterpret_cast<float*>(b + value()); }
  void write_step(uint8_t* b, int32_t step) const { std::memcpy(b + row_step(), &step, 4); }
};

}  // namespace jtok
