// The elementwise kernels' two paths (cuda/vec.cuh): a thread a 16-byte vector where every pointer
// is 16-byte aligned and every row length a multiple of the vector, else a thread an element. The same
// inputs through both give the same bits (an output pointer one element off its alignment takes the
// element path), and the kernel trace says which path ran. Part of test_cuda_ops; also compiled
// unchanged by tests/cuda/emulate_kernels.sh (no GPU).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda/cross_entropy.h"
#include "cuda/embedding.h"
#include "cuda/jtok.h"
#include "cuda/kernel_trace.h"
#include "cuda/rope.h"
#include "cuda/swiglu.h"
#include "cuda/vec.h"
#include "cuda_case.h"
#include "ops/rope.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;

// h after `off` zeros.
std::vector<float> shifted(std::vector<float> h, int64_t off) {
  h.insert(h.begin(), off, 0.0f);
  return h;
}

// Device T of n elements at offset `off` of their own allocation (off 1: not 16-byte aligned).
template <typename T>
struct Placed {
  DeviceBuffer<T> buf;
  int64_t off, n;
  Placed(int64_t count, int64_t offset) : buf(count + offset), off(offset), n(count) {}
  Placed(const std::vector<float>& h, int64_t offset)
      : buf(upload<T>(shifted(h, offset))), off(offset), n(static_cast<int64_t>(h.size())) {}
  T* get() const { return buf.get() + off; }
  std::vector<float> values() const {
    const std::vector<float> all = download(buf);
    return std::vector<float>(all.begin() + off, all.begin() + off + n);
  }
};

// The kernels run by `launch` whose names hold "_vec_kernel" and the others.
std::pair<int64_t, int64_t> vec_and_element_kernels(const std::function<void()>& launch) {
  EXPECT_EQ(jtok::cuda::kernel_trace_start(), "");
  launch();
  JTOK_CUDA_CHECK(cudaDeviceSynchronize());
  std::pair<int64_t, int64_t> n{0, 0};
  for (const jtok::cuda::TraceRecord& r : jtok::cuda::kernel_trace_stop())
    if (r.kind == "kernel") ++(r.name.find("_vec_kernel") != std::string::npos ? n.first : n.second);
  return n;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what << ": the two paths' bits differ";
}

// SwiGLU forward and backward on a fused (N, 2F) buffer, outputs at offset `off`.
template <typename T>
std::vector<float> swiglu_outputs(int64_t off, std::pair<int64_t, int64_t>& kernels) {
  const int64_t N = 19, F = 72, ld = 2 * F;
  auto gu = upload<T>(randn(N * ld, 31, 2.0f)), dy = upload<T>(randn(N * F, 32));
  Placed<T> out(N * F, off), dgu(N * ld, off);
  kernels = vec_and_element_kernels([&] {
    jtok::cuda::swiglu_forward(out.get(), gu.get(), gu.get() + F, N, F, ld, nullptr);
    jtok::cuda::swiglu_backward(dgu.get(), dgu.get() + F, dy.get(), gu.get(), gu.get() + F, N, F, ld, nullptr);
  });
  std::vector<float> v = out.values(), d = dgu.values();
  v.insert(v.end(), d.begin(), d.end());
  return v;
}

// JTok's gate (h_next = h_mid + mlp_out * (1 + s Norm(E[x]))) and the embedding's gather of the same
// ids, outputs at offset `off`.
template <typename T>
std::vector<float> gate_and_gather_outputs(int64_t off, std::pair<int64_t, int64_t>& kernels) {
  const int64_t N = 45, V = 30, d = 48;
  const auto ids = skewed_ids(N, V, 33);
  auto did = upload_exact(ids);
  auto rows = upload<T>(randn(V * d, 34)), hm = upload<T>(randn(N * d, 35)), mo = upload<T>(randn(N * d, 36)),
       s = upload<T>(randn(d, 37, 0.3f));
  jtok::cuda::DeviceRowBatch rb{};
  rb.inverse = did.get();  // the gate reads a position's row of nrows by inverse: here the table itself
  Placed<T> hn(N * d, off), emb(N * d, off);
  kernels = vec_and_element_kernels([&] {
    jtok::cuda::jtok_forward(hn.get(), hm.get(), mo.get(), s.get(), rows.get(), rb, N, d, nullptr);
    jtok::cuda::embedding_forward(emb.get(), did.get(), rows.get(), N, d, nullptr);
  });
  std::vector<float> v = hn.values(), e = emb.values();
  v.insert(v.end(), e.begin(), e.end());
  return v;
}

// Cross-entropy in place over padded rows (the LM head's chunks: V 1000 of Vp 1008), losses and the
// gradient, logits at offset `off`.
template <typename T>
std::vector<float> cross_entropy_outputs(int64_t off, std::pair<int64_t, int64_t>& kernels) {
  const int64_t N = 7, V = 1000, Vp = 1008;
  auto targets = upload_exact(skewed_ids(N, V, 38));
  Placed<T> logits(randn(N * Vp, 39, 3.0f), off);
  DeviceBuffer<float> losses(N);
  kernels = vec_and_element_kernels([&] {
    jtok::cuda::cross_entropy(logits.get(), losses.get(), logits.get(), targets.get(), N, V, Vp, 0.5f, nullptr);
  });
  std::vector<float> v = logits.values(), l = download(losses);
  v.insert(v.end(), l.begin(), l.end());
  return v;
}

// RoPE forward then backward on q | k heads inside wider rows (H 3 of hd 16 in rows of 80, as in a
// fused q | k | v row), the rows at offset `off`.
template <typename S>
std::vector<float> rope_outputs(int64_t off, std::pair<int64_t, int64_t>& kernels) {
  const int64_t B = 2, T = 7, H = 3, hd = 16, stride = 80;
  const jtok::RopeTable tab = jtok::make_rope_table(T, hd, 10000.0);
  auto cos = upload<float>(tab.cos), sin = upload<float>(tab.sin);
  Placed<S> x(randn(B * T * stride, 40), off);
  kernels = vec_and_element_kernels([&] {
    jtok::cuda::rope_forward(x.get(), cos.get(), sin.get(), B, T, H, hd, stride, 0, nullptr);
    jtok::cuda::rope_backward(x.get(), cos.get(), sin.get(), B, T, H, hd, stride, nullptr);
  });
  return x.values();
}

template <typename T>
void expect_paths_agree(std::vector<float> (*outputs)(int64_t, std::pair<int64_t, int64_t>&), int64_t launches,
                        const std::string& what) {
  std::pair<int64_t, int64_t> vec, element;
  const std::vector<float> a = outputs(0, vec), b = outputs(1, element);
  EXPECT_EQ(vec, std::make_pair(launches, int64_t{0})) << what << ": aligned, every launch a vector kernel";
  EXPECT_EQ(element, std::make_pair(int64_t{0}, launches))
      << what << ": one element off, every launch an element kernel";
  expect_same_bits(a, b, what);
}

TEST(CudaVec, VectorAndElementPathsGiveTheSameBits) {
  expect_paths_agree<float>(swiglu_outputs<float>, 2, "swiglu fp32");
  expect_paths_agree<__nv_bfloat16>(swiglu_outputs<__nv_bfloat16>, 2, "swiglu bf16");
  expect_paths_agree<float>(gate_and_gather_outputs<float>, 2, "jtok gate + embedding fp32");
  expect_paths_agree<__nv_bfloat16>(gate_and_gather_outputs<__nv_bfloat16>, 2, "jtok gate + embedding bf16");
  expect_paths_agree<float>(rope_outputs<float>, 2, "rope fp32");
  expect_paths_agree<__nv_bfloat16>(rope_outputs<__nv_bfloat16>, 2, "rope bf16");
  expect_paths_agree<float>(cross_entropy_outputs<float>, 1, "cross-entropy fp32");
  expect_paths_agree<__nv_bfloat16>(cross_entropy_outputs<__nv_bfloat16>, 1, "cross-entropy bf16");
}

// Where the vectors fit: 16-byte aligned pointers and row lengths a multiple of 8 bf16 or 4 fp32.
TEST(CudaVec, FitsOnlyAlignedWholeVectors) {
  alignas(16) static float buf[16];
  EXPECT_TRUE(jtok::cuda::vec_fits<float>({buf, buf + 4}, {8, 12}));
  EXPECT_FALSE(jtok::cuda::vec_fits<float>({buf, buf + 1}, {8}));
  EXPECT_FALSE(jtok::cuda::vec_fits<float>({buf}, {6}));
  EXPECT_TRUE(jtok::cuda::vec_fits<__nv_bfloat16>({buf}, {16, 72}));
  EXPECT_FALSE(jtok::cuda::vec_fits<__nv_bfloat16>({buf}, {12}));
  EXPECT_FALSE(jtok::cuda::vec_fits<__nv_bfloat16>({buf + 2}, {8}));
}

}  // namespace
