// A fixed-size float array that starts zeroed without writing its pages: a block of 1 MiB or more
// comes from mmap, whose fresh pages read as zero and cost no resident memory until written. A
// model's flat parameter buffer is one: an inference copy that holds its matrices in bf16 / int8
// (model/lowp_weights.h) never writes their fp32 slots, so loading it peaks near its own size
// rather than the fp32 model's (std::vector would write every zero first).
//   FloatBuffer b(n);  // n zeros; b.data(), b.size(), b[i], begin/end; copies copy; == compares
#pragma once
#include <cstddef>
#include <cstdint>

namespace jtok {

class FloatBuffer {
 public:
  using value_type = float;
  using iterator = float*;
  using const_iterator = const float*;

  FloatBuffer() = default;
  explicit FloatBuffer(size_t n);
  FloatBuffer(const FloatBuffer& o);
  FloatBuffer(FloatBuffer&& o) noexcept;
  FloatBuffer& operator=(FloatBuffer o) noexcept;  // copy-and-swap
  ~FloatBuffer();

  float* data() { return p_; }
  const float* data() const { return p_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  float& operator[](size_t i) { return p_[i]; }
  const float& operator[](size_t i) const { return p_[i]; }
  float* begin() { return p_; }
  float* end() { return p_ + n_; }
  const float* begin() const { return p_; }
  const float* end() const { return p_ + n_; }

  friend bool operator==(const FloatBuffer& a, const FloatBuffer& b);
  friend void swap(FloatBuffer& a, FloatBuffer& b) noexcept;

 private:
  float* p_ = nullptr;
  size_t n_ = 0;
  bool mapped_ = false;  // from mmap (else calloc)
};

}  // namespace jtok
