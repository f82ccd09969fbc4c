// Device memory of n elements of T owned by one object (freed with it), pinned host memory likewise,
// and the host <-> device copies the model's set-up and its checks use. Host code only; includable
// from g++ code.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "cuda/check.h"
#include "cuda/device.h"

namespace jtok::cuda {

template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(int64_t n) { resize(n); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceArray() { release(); }

  // n elements, contents undefined (a size of 0 holds no memory).
  void resize(int64_t n) {
    if (n == n_) return;
    release();
    if (n > 0) JTOK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), static_cast<size_t>(n) * sizeof(T)));
    n_ = n;
    note_device_bytes(static_cast<int64_t>(bytes()));
  }
  void zero(cudaStream_t stream) {
    if (n_) JTOK_CUDA_CHECK(cudaMemsetAsync(ptr_, 0, bytes(), stream));
  }
  T* get() const { return ptr_; }
  int64_t size() const { return n_; }
  size_t bytes() const { return static_cast<size_t>(n_) * sizeof(T); }

 private:
  void release() {
    if (ptr_) {
      cudaFree(ptr_);
      note_device_bytes(-static_cast<int64_t>(bytes()));
    }
    ptr_ = nullptr;
    n_ = 0;
  }
  T* ptr_ = nullptr;
  int64_t n_ = 0;
};

// Pinned host memory (cudaHostAlloc) of n elements of T, freed with the object.
template <typename T>
class PinnedArray {
 public:
  PinnedArray() = default;
  explicit PinnedArray(int64_t n) : n_(n) {
    if (n > 0) JTOK_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&ptr_), static_cast<size_t>(n) * sizeof(T), 0));
  }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  PinnedArray(PinnedArray&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  PinnedArray& operator=(PinnedArray&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~PinnedArray() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  T* get() const { return ptr_; }
  int64_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  int64_t n_ = 0;
};

// host (n) -> device (n), synchronous.
template <typename T>
void copy_to_device(T* dst, const T* src, int64_t n) {
  if (n > 0) JTOK_CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(n) * sizeof(T), cudaMemcpyHostToDevice));
}
// device (n) -> host (n), after the work queued on stream has finished.
template <typename T>
void copy_to_host(T* dst, const T* src, int64_t n, cudaStream_t stream) {
  JTOK_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (n > 0) JTOK_CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(n) * sizeof(T), cudaMemcpyDeviceToHost));
}

// Small device values read back with one synchronisation (each copy_to_host is two: the stream's,
// then a pageable copy's own): the copies queued into pinned host memory, then one wait.
//   rb.begin(bytes); const double* x = rb.queue(dev_x, n, s); ...; rb.wait(s); read x[0..n)
class HostReadback {
 public:
  // Room for `bytes` of queued values (aligned to 8 each); nothing may be queued yet.
  void begin(size_t bytes) {
    JTOK_CHECK(used_ == 0, "HostReadback: begin with copies still queued");
    if (static_cast<size_t>(room_.size()) < bytes) room_ = PinnedArray<unsigned char>(static_cast<int64_t>(bytes));
  }
  // The n values at device src copied to the returned host address, queued on stream: valid after wait.
  template <typename T>
  const T* queue(const T* src, int64_t n, cudaStream_t stream) {
    const size_t at = (used_ + 7) / 8 * 8, bytes = static_cast<size_t>(n) * sizeof(T);
    JTOK_CHECK(at + bytes <= static_cast<size_t>(room_.size()), "HostReadback: ", at + bytes,
               " bytes queued past the ", room_.size(), " begun");
    T* dst = reinterpret_cast<T*>(room_.get() + at);
    if (bytes > 0) JTOK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
    used_ = at + bytes;
    return dst;
  }
  // The stream's work done, every queued value on the host; the room free for the next begin.
  void wait(cudaStream_t stream) {
    JTOK_CUDA_CHECK(cudaStreamSynchronize(stream));
    used_ = 0;
  }
  // The caller has waited for the stream since the copies were queued: every value is on the host.
  void waited() { used_ = 0; }
  // One array alone: begun, queued and waited for; its n values on the host (until the next begin).
  template <typename T>
  const T* read(const T* src, int64_t n, cudaStream_t stream) {
    begin(room_for<T>(n));
    const T* host = queue(src, n, stream);
    wait(stream);
    return host;
  }
  // The bytes a queue of n values of T takes at most (its alignment included).
  template <typename T>
  static size_t room_for(int64_t n) {
    return static_cast<size_t>(n) * sizeof(T) + 8;
  }

 private:
  PinnedArray<unsigned char> room_;
  size_t used_ = 0;
};

}  // namespace jtok::cuda
