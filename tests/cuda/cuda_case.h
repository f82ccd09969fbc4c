// The CUDA op test harness (issue 39; ggml's test-backend-ops in kind): one case per op, run over
// both dtypes, its outputs (forward results and gradients, by name) compared with the CPU engine's
// own op by normalised error ||gpu - cpu|| / ||cpu||.
//
//   CudaCase c{"rmsnorm", "B*T 37, C 96", {1e-6, 1e-2}};
//   c.cpu = [&](DType t) { ... run src/ops on host arrays rounded to t's precision (to_dtype) ... };
//   c.gpu = [&](DType t) { ... upload<T>, launch, download ... };
//   run_case(c);
//
// The CPU side sees the inputs the GPU sees: in a bf16 run its inputs are rounded to bf16 first
// (to_dtype), so the error measured is the GPU's arithmetic (bf16 storage of intermediates and
// outputs, fp32 accumulation), not the rounding of the inputs. Each run prints one line per output
// with its error and tolerance: the record a GPU session keeps (docs/).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/check.h"
#include "op_test_util.h"

namespace jtok::cuda_test {

enum class DType { f32, bf16 };
inline const char* dtype_name(DType t) { return t == DType::f32 ? "fp32" : "bf16"; }

// bf16 <-> fp32 on the host by bits (round to nearest even; NaN kept a quiet NaN).
inline uint16_t f32_to_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_bits_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
// A host array as a dtype holds it: fp32 unchanged, bf16 rounded.
inline std::vector<float> to_dtype(std::vector<float> v, DType t) {
  if (t == DType::bf16)
    for (float& x : v) x = bf16_bits_to_f32(f32_to_bf16_bits(x));
  return v;
}

// Device memory of n elements of T, freed with the object.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    if (n) JTOK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(T)));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), n(o.n) { o.ptr = nullptr; o.n = 0; }
  ~DeviceBuffer() { if (ptr) cudaFree(ptr); }
  T* get() const { return ptr; }
  void zero() { if (n) JTOK_CUDA_CHECK(cudaMemset(ptr, 0, n * sizeof(T))); }
};

// Host fp32 -> device T (float, or __nv_bfloat16 rounded to nearest even).
template <typename T>
DeviceBuffer<T> upload(const std::vector<float>& h) {
  DeviceBuffer<T> d(h.size());
  if constexpr (sizeof(T) == 4) {
    JTOK_CUDA_CHECK(cudaMemcpy(d.ptr, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  } else {
    std::vector<uint16_t> bits(h.size());
    for (size_t i = 0; i < h.size(); ++i) bits[i] = f32_to_bf16_bits(h[i]);
    JTOK_CUDA_CHECK(cudaMemcpy(d.ptr, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  }
  return d;
}

// Device T -> host fp32 (synchronous: a launch's errors surface here at the latest).
template <typename T>
std::vector<float> download(const DeviceBuffer<T>& d) {
  std::vector<float> h(d.n);
  JTOK_CUDA_CHECK(cudaDeviceSynchronize());
  if constexpr (sizeof(T) == 4) {
    JTOK_CUDA_CHECK(cudaMemcpy(h.data(), d.ptr, d.n * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<uint16_t> bits(d.n);
    JTOK_CUDA_CHECK(cudaMemcpy(bits.data(), d.ptr, d.n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < d.n; ++i) h[i] = bf16_bits_to_f32(bits[i]);
  }
  return h;
}

// Integer ids and other exact arrays: no dtype.
template <typename I>
DeviceBuffer<I> upload_exact(const std::vector<I>& h) {
  DeviceBuffer<I> d(h.size());
  if (!h.empty()) JTOK_CUDA_CHECK(cudaMemcpy(d.ptr, h.data(), h.size() * sizeof(I), cudaMemcpyHostToDevice));
  return d;
}
template <typename I>
std::vector<I> download_exact(const DeviceBuffer<I>& d) {
  std::vector<I> h(d.n);
  JTOK_CUDA_CHECK(cudaDeviceSynchronize());
  if (d.n) JTOK_CUDA_CHECK(cudaMemcpy(h.data(), d.ptr, d.n * sizeof(I), cudaMemcpyDeviceToHost));
  return h;
}

// Named outputs of one run: forward results and gradients, each as fp32 on the host.
using Outputs = std::vector<std::pair<std::string, std::vector<float>>>;

struct Tolerance {
  double f32 = 1e-5;   // fp32: accumulation order only
  double bf16 = 2e-2;  // bf16: storage rounding (2^-8 relative) through the op
};

struct CudaCase {
  CudaCase(std::string n, std::string s, Tolerance t) : name(std::move(n)), shape(std::move(s)), tol(t) {}
  std::string name;   // "rmsnorm"
  std::string shape;  // "N 37, C 200"
  Tolerance tol;
  std::function<Outputs(DType)> cpu;  // the CPU engine's op on inputs as the dtype holds them
  std::function<Outputs(DType)> gpu;  // the CUDA op on device copies of the same inputs
};

// Calls f(float{}) or f(__nv_bfloat16{}) (a generic lambda over the storage type) for the run's dtype.
template <typename F>
Outputs by_dtype(DType t, F&& f) {
  return t == DType::f32 ? f(float{}) : f(__nv_bfloat16{});
}

// Zipfian-like ids in [0, V) (u^3 scaled): hot ids at many positions, and singletons.
inline std::vector<int32_t> skewed_ids(int64_t N, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (auto& id : ids) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    id = static_cast<int32_t>(std::min<double>(static_cast<double>(V - 1), std::floor(std::pow(u, 3.0) * V)));
  }
  return ids;
}

inline const std::vector<float>* find_output(const Outputs& o, const std::string& name) {
  for (const auto& [n, v] : o)
    if (n == name) return &v;
  return nullptr;
}

// Runs the case for fp32 and bf16: every CPU output must come back from the GPU, of the same size,
// finite, within the dtype's tolerance.
inline void run_case(const CudaCase& c) {
  for (DType t : {DType::f32, DType::bf16}) {
    const Outputs want = c.cpu(t);
    const Outputs got = c.gpu(t);
    const double tol = t == DType::f32 ? c.tol.f32 : c.tol.bf16;
    for (const auto& [name, ref] : want) {
      SCOPED_TRACE(c.name + " [" + c.shape + "] " + dtype_name(t) + " " + name);
      const std::vector<float>* g = find_output(got, name);
      ASSERT_NE(g, nullptr) << "the GPU run gave no output " << name;
      ASSERT_EQ(g->size(), ref.size());
      for (size_t i = 0; i < g->size(); ++i) ASSERT_TRUE(std::isfinite((*g)[i])) << "element " << i << " = " << (*g)[i];
      const double err = jtok::testing::rel_err(*g, ref);
      std::printf("cuda case %-24s %-28s %s %-10s err %.3e (tol %.1e)\n", c.name.c_str(), c.shape.c_str(),
                  dtype_name(t), name.c_str(), err, tol);
      EXPECT_LE(err, tol);
    }
  }
}

// The bf16 copy a kernel writes of an fp32 master (AdamW's p_bf16 of p): every element the GPU's own
// master rounded to nearest even, bit for bit. Checked against the GPU's master, not the CPU's: GCC
// contracts the CPU's AdamW into FMAs (-march=native), so its p may differ in the last fp32 bit, and
// one such element across a bf16 rounding boundary puts the normalised error of the copies past a
// 1e-6 tolerance (about one set of inputs in ten, by an emulation of both).
inline void expect_bf16_copy(const std::vector<float>& copy, const std::vector<float>& master) {
  ASSERT_EQ(copy.size(), master.size());
  const std::vector<float> want = to_dtype(master, DType::bf16);
  for (size_t i = 0; i < copy.size(); ++i)
    ASSERT_EQ(0, std::memcmp(&copy[i], &want[i], sizeof(float))) << "bf16 copy element " << i << " = " << copy[i]
                                                                  << ", master " << master[i];
}

// Runs the GPU side twice on the same inputs: every output bitwise the same (no atomics deciding bits).
inline void expect_deterministic(const CudaCase& c, DType t) {
  const Outputs a = c.gpu(t), b = c.gpu(t);
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    SCOPED_TRACE(c.name + " " + dtype_name(t) + " " + a[k].first);
    ASSERT_EQ(a[k].second.size(), b[k].second.size());
    EXPECT_EQ(0, std::memcmp(a[k].second.data(), b[k].second.data(), a[k].second.size() * sizeof(float)));
  }
}

}  // namespace jtok::cuda_test
