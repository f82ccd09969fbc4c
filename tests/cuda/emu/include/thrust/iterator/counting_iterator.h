// thrust::counting_iterator for the CPU emulation (the input of table_rows.cu's cub call): it[i] = start + i.
#pragma once
#include <cstdint>

namespace thrust {
template <typename T>
class counting_iterator {
 public:
  explicit counting_iterator(T start) : start_(start) {}
  T operator[](int64_t i) const { return static_cast<T>(start_ + i); }
  T operator*() const { return start_; }
  counting_iterator operator+(int64_t i) const { return counting_iterator(static_cast<T>(start_ + i)); }

 private:
  T start_;
};
}  // namespace thrust
