#include "core/float_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace jtok {

namespace {
constexpr size_t kMapBytes = size_t(1) << 20;  // from here on, mmap: zero pages, none resident yet
}

FloatBuffer::FloatBuffer(size_t n) : n_(n) {
  if (n == 0) return;
  if (n > SIZE_MAX / sizeof(float)) throw std::bad_alloc();
  const size_t bytes = n * sizeof(float);
  if (bytes >= kMapBytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    p_ = static_cast<float*>(p);
    mapped_ = true;
  } else {
    p_ = static_cast<float*>(std::calloc(n, sizeof(float)));
    if (!p_) throw std::bad_alloc();
  }
}

FloatBuffer::FloatBuffer(const FloatBuffer& o) : FloatBuffer(o.n_) {
  if (n_) std::memcpy(p_, o.p_, n_ * sizeof(float));
}

FloatBuffer::FloatBuffer(FloatBuffer&& o) noexcept { swap(*this, o); }

FloatBuffer& FloatBuffer::operator=(FloatBuffer o) noexcept {
  swap(*this, o);
  return *this;
}

FloatBuffer::~FloatBuffer() {
  if (!p_) return;
  if (mapped_) munmap(p_, n_ * sizeof(float));
  else std::free(p_);
}

bool operator==(const FloatBuffer& a, const FloatBuffer& b) {
  return a.n_ == b.n_ && std::equal(a.begin(), a.end(), b.begin());  // float ==, as std::vector's
}

void swap(FloatBuffer& a, FloatBuffer& b) noexcept {
  std::swap(a.p_, b.p_);
  std::swap(a.n_, b.n_);
  std::swap(a.mapped_, b.mapped_);
}

}  // namespace jtok
