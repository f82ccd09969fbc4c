// CUDA flash attention (src/cuda/attention.h) against the CPU engine's attention (ops/attention.h),
// forward (out, lse) and backward (dq, dk, dv), fp32 and bf16, through tests/cuda/cuda_case.h.
// The CPU attention's own backward is checked by finite differences in tests/test_ops.cpp
// (Attention.FastMatchesReferenceAndFiniteDifferences), so the GPU's gradients are checked against
// a checked twin.
// Tolerances by normalised error ||gpu - cpu|| / ||cpu||:
//   fp32 1e-5: the same arithmetic in another order (and the GPU's expf against the CPU's).
//   bf16 2e-2: the inputs are bf16 on both sides (cuda_case.h); the GPU stores out and the
//   gradients in bf16 (2^-9 relative each) and its backward reads its own bf16 out for D.
// Shapes: B 2, T from 1 to 257 around the 32-row tiles (1, 31, 32, 33, 65, 100, 257), 4 query heads
// with 4, 2 and 1 kv heads, head dims 32, 64 and 128; and the MoE bench's layer (configs/bench_moe.json:
// d 128 over 4 heads / 2 kv heads, hd 32, T 128).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <functional>
#include <memory>
#include <string>

#include "cuda/attention.h"
#include "cuda/rope.h"
#include "cuda_case.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/rope.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;

struct AttnShape {
  int64_t B, T, H, KV, hd;
};

std::string describe(const AttnShape& s) {
  return "B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " H " + std::to_string(s.H) + " KV " +
         std::to_string(s.KV) + " hd " + std::to_string(s.hd);
}

// Inputs of one case, and the gradients' starting values (non-zero: both backwards accumulate).
struct AttnInputs {
  AttnShape s;
  std::vector<float> q, k, v, dout, dq0, dk0, dv0;
};

std::shared_ptr<const AttnInputs> make_inputs(const AttnShape& s, uint64_t seed) {
  auto in = std::make_shared<AttnInputs>();
  const size_t nq = static_cast<size_t>(s.B * s.T * s.H * s.hd), nkv = static_cast<size_t>(s.B * s.T * s.KV * s.hd);
  in->s = s;
  in->q = randn(nq, seed);
  in->k = randn(nkv, seed + 1);
  in->v = randn(nkv, seed + 2);
  in->dout = randn(nq, seed + 3);
  in->dq0 = randn(nq, seed + 4, 0.5f);
  in->dk0 = randn(nkv, seed + 5, 0.5f);
  in->dv0 = randn(nkv, seed + 6, 0.5f);
  return in;
}

// The CPU engine's attention (fp32 matmul precision: its checking path) on the inputs as t holds them.
Outputs cpu_attention(const AttnInputs& in, DType t) {
  const auto [B, T, H, KV, hd] = in.s;
  EXPECT_EQ(jtok::matmul_precision(), jtok::MatmulPrecision::fp32);
  const auto q = to_dtype(in.q, t), k = to_dtype(in.k, t), v = to_dtype(in.v, t), dout = to_dtype(in.dout, t);
  std::vector<float> out(q.size()), lse(static_cast<size_t>(B * H * T));
  jtok::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd);
  auto dq = to_dtype(in.dq0, t), dk = to_dtype(in.dk0, t), dv = to_dtype(in.dv0, t);
  jtok::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(), k.data(),
                           v.data(), B, T, H, KV, hd);
  return {{"out", out}, {"lse", lse}, {"dq", dq}, {"dk", dk}, {"dv", dv}};
}

// Fills a device buffer with all-ones bits (NaN in fp32 and bf16): every entry must be written.
template <typename T>
void poison(DeviceBuffer<T>& d) {
  JTOK_CUDA_CHECK(cudaMemset(d.get(), 0xff, d.n * sizeof(T)));
}

template <typename E>
Outputs gpu_attention(const AttnInputs& in) {
  const auto [B, T, H, KV, hd] = in.s;
  auto q = upload<E>(in.q), k = upload<E>(in.k), v = upload<E>(in.v), dout = upload<E>(in.dout);
  DeviceBuffer<E> out(in.q.size());
  DeviceBuffer<float> lse(static_cast<size_t>(B * H * T)), row_terms(static_cast<size_t>(B * H * T));
  poison(out);
  poison(lse);
  poison(row_terms);
  jtok::cuda::attention_forward<E>(out.get(), lse.get(), q.get(), k.get(), v.get(), B, T, H, KV, hd, nullptr);
  auto dq = upload<E>(in.dq0), dk = upload<E>(in.dk0), dv = upload<E>(in.dv0);
  jtok::cuda::attention_backward<E>(dq.get(), dk.get(), dv.get(), row_terms.get(), dout.get(), out.get(), lse.get(),
                                    q.get(), k.get(), v.get(), B, T, H, KV, hd, nullptr);
  return {{"out", download(out)}, {"lse", download(lse)}, {"dq", download(dq)}, {"dk", download(dk)},
          {"dv", download(dv)}};
}

// Packed q (B,T,H,hd), k, v (B,T,KV,hd) as one fused row per token (B,T,(H+2KV)hd): q | k | v.
std::vector<float> fuse_rows(const AttnShape& s, const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& v) {
  const int64_t qw = s.H * s.hd, kw = s.KV * s.hd;
  std::vector<float> f;
  f.reserve(q.size() + k.size() + v.size());
  for (int64_t r = 0; r < s.B * s.T; ++r) {
    f.insert(f.end(), q.begin() + r * qw, q.begin() + (r + 1) * qw);
    f.insert(f.end(), k.begin() + r * kw, k.begin() + (r + 1) * kw);
    f.insert(f.end(), v.begin() + r * kw, v.begin() + (r + 1) * kw);
  }
  return f;
}

// The q, k or v part (offset, width) of every fused row.
std::vector<float> rows_part(const std::vector<float>& f, int64_t rows, int64_t width, int64_t offset, int64_t part) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(rows * part));
  for (int64_t r = 0; r < rows; ++r) out.insert(out.end(), f.begin() + r * width + offset, f.begin() + r * width + offset + part);
  return out;
}

// The same op with q, k, v and their gradients inside fused qkv rows (AttnStrides): the layout of a
// fused qkv projection (cuda/rope.h's stride). overwrite: the gradients' rows poisoned (NaN) and
// written over (accumulate false, as the model's backward), so every element must be written and
// none read. rope: the backward given RoPE's tables, dq and dk through its inverse as the model has them
// (the bf16 kernels' own; fp32 returns false and cuda rope_backward follows).
template <typename E>
Outputs gpu_attention_fused(const AttnInputs& in, bool overwrite = false, const jtok::RopeTable* rope = nullptr) {
  const auto [B, T, H, KV, hd] = in.s;
  const int64_t W = (H + 2 * KV) * hd, qw = H * hd, kw = KV * hd;
  const jtok::cuda::AttnStrides strides{W, W};
  auto qkv = upload<E>(fuse_rows(in.s, in.q, in.k, in.v)), dqkv = upload<E>(fuse_rows(in.s, in.dq0, in.dk0, in.dv0));
  if (overwrite) poison(dqkv);
  auto dout = upload<E>(in.dout);
  DeviceBuffer<E> out(in.q.size());
  DeviceBuffer<float> lse(static_cast<size_t>(B * H * T)), row_terms(static_cast<size_t>(B * H * T));
  poison(out);
  poison(lse);
  const E *q = qkv.get(), *k = q + qw, *v = k + kw;
  E *dq = dqkv.get(), *dk = dq + qw, *dv = dk + kw;
  jtok::cuda::attention_forward<E>(out.get(), lse.get(), q, k, v, B, T, H, KV, hd, nullptr, strides);
  DeviceBuffer<float> cos = upload<float>(rope ? rope->cos : std::vector<float>{}),
                      sin = upload<float>(rope ? rope->sin : std::vector<float>{});
  const jtok::cuda::RopeTables tables{rope ? cos.get() : nullptr, rope ? sin.get() : nullptr};
  const bool rotated =
      jtok::cuda::attention_backward<E>(dq, dk, dv, row_terms.get(), dout.get(), out.get(), lse.get(), q, k, v, B, T, H,
                                        KV, hd, nullptr, strides, !overwrite, tables);
  EXPECT_EQ(rotated, rope && sizeof(E) == 2) << "RoPE's inverse in the bf16 kernels only";
  if (rope && !rotated) jtok::cuda::rope_backward<E>(dq, cos.get(), sin.get(), B, T, H + KV, hd, W, nullptr);
  const auto g = download(dqkv);
  return {{"out", download(out)},
          {"lse", download(lse)},
          {"dq", rows_part(g, B * T, W, 0, qw)},
          {"dk", rows_part(g, B * T, W, qw, kw)},
          {"dv", rows_part(g, B * T, W, qw + kw, kw)}};
}

// overwrite (fused only): the GPU's gradients written over poisoned rows, the CPU's accumulated from zero.
CudaCase attention_case(const AttnShape& s, bool fused = false, bool overwrite = false) {
  auto made = make_inputs(s, 100 + static_cast<uint64_t>(s.T * 7 + s.KV * 3 + s.hd));
  if (overwrite) {
    auto zero = std::make_shared<AttnInputs>(*made);
    for (auto* g : {&zero->dq0, &zero->dk0, &zero->dv0}) std::fill(g->begin(), g->end(), 0.0f);
    made = zero;
  }
  const std::shared_ptr<const AttnInputs> in = made;
  CudaCase c{overwrite ? "attention fused, written over"
             : fused   ? "attention fused qkv"
                       : "attention fwd+bwd",
             describe(s),
             {1e-5, 2e-2}};
  c.cpu = [in](DType t) { return cpu_attention(*in, t); };
  if (fused)
    c.gpu = [in, overwrite](DType t) {
      return by_dtype(t, [&](auto e) { return gpu_attention_fused<decltype(e)>(*in, overwrite); });
    };
  else
    c.gpu = [in](DType t) { return by_dtype(t, [&](auto e) { return gpu_attention<decltype(e)>(*in); }); };
  return c;
}

class CudaAttention : public ::testing::TestWithParam<AttnShape> {};

TEST_P(CudaAttention, MatchesCpuForwardAndBackward) { run_case(attention_case(GetParam())); }

std::vector<AttnShape> attention_shapes() {
  std::vector<AttnShape> shapes;
  for (int64_t hd : {32, 64, 128})
    for (int64_t kv : {4, 2, 1})
      for (int64_t T : {1, 33, 257}) shapes.push_back({2, T, 4, kv, hd});
  for (int64_t T : {31, 32, 65, 100}) shapes.push_back({2, T, 4, 2, 64});
  for (int64_t T : {65, 100, 128}) shapes.push_back({2, T, 4, 2, 32});
  return shapes;
}

// q, k, v read from (and their gradients written into) fused qkv rows give the packed results; and
// written over NaN rows (accumulate false: the model's backward, no zeroing first) the CPU's from zero.
TEST(CudaAttentionBits, FusedQkvRowsMatchCpu) {
  for (const AttnShape& s : {AttnShape{2, 70, 4, 2, 64}, AttnShape{2, 33, 4, 1, 128}, AttnShape{1, 257, 4, 4, 64},
                            AttnShape{2, 100, 4, 2, 32}})
    run_case(attention_case(s, true));
  for (const AttnShape& s : {AttnShape{2, 70, 4, 2, 64}, AttnShape{2, 33, 4, 1, 128}})
    run_case(attention_case(s, true, true));
}

// The model's backward through RoPE, written over NaN rows of fused qkv (gpu_attention_fused's rope),
// against the CPU's attention_backward from zero, then RoPE's backward on its dq and dk: in bf16 one
// rounding (the kernels rotate the fp32 sums) where the CPU rotates fp32 values of bf16 inputs.
TEST(CudaAttentionBits, BackwardThroughRopeMatchesCpu) {
  for (const AttnShape& s : {AttnShape{2, 70, 4, 2, 64}, AttnShape{2, 33, 4, 1, 128}, AttnShape{1, 100, 4, 4, 32}}) {
    auto zero = std::make_shared<AttnInputs>(*make_inputs(s, 300 + static_cast<uint64_t>(s.T)));
    for (auto* g : {&zero->dq0, &zero->dk0, &zero->dv0}) std::fill(g->begin(), g->end(), 0.0f);
    const std::shared_ptr<const AttnInputs> in = zero;
    const jtok::RopeTable tab = jtok::make_rope_table(s.T, s.hd, 10000.0);
    CudaCase c{"attention through rope", describe(s), {1e-5, 2e-2}};
    c.cpu = [&](DType t) {
      Outputs o = cpu_attention(*in, t);  // out, lse, dq, dk, dv
      jtok::rope_backward(o[2].second.data(), tab, s.B, s.T, s.H, s.hd);
      jtok::rope_backward(o[3].second.data(), tab, s.B, s.T, s.KV, s.hd);
      return o;
    };
    c.gpu = [&](DType t) {
      return by_dtype(t, [&](auto e) { return gpu_attention_fused<decltype(e)>(*in, true, &tab); });
    };
    run_case(c);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention, ::testing::ValuesIn(attention_shapes()),
                         [](const ::testing::TestParamInfo<AttnShape>& i) {
                           const AttnShape& s = i.param;
                           return "T" + std::to_string(s.T) + "_KV" + std::to_string(s.KV) + "_hd" +
                                  std::to_string(s.hd);
                         });

// No atomics: two runs give the same bits, GQA with one kv head (the longest dk/dv loop).
TEST(CudaAttentionBits, TwoRunsAreBitwiseEqual) {
  const CudaCase c = attention_case({2, 257, 4, 1, 128});
  expect_deterministic(c, DType::f32);
  expect_deterministic(c, DType::bf16);
}

// Causality on the GPU itself: changing the keys and values after position 0 leaves row 0's output.
TEST(CudaAttentionBits, FirstRowSeesOnlyTheFirstKey) {
  const AttnShape s{1, 40, 4, 2, 64};
  auto in = make_inputs(s, 7);
  const Outputs a = gpu_attention<float>(*in);
  auto changed = std::make_shared<AttnInputs>(*in);
  for (size_t i = static_cast<size_t>(s.KV * s.hd); i < changed->v.size(); ++i) {
    changed->k[i] += 1.0f;
    changed->v[i] -= 2.0f;
  }
  const Outputs b = gpu_attention<float>(*changed);
  for (int64_t i = 0; i < s.H * s.hd; ++i) EXPECT_EQ(a[0].second[i], b[0].second[i]) << "out element " << i;
}

// The bf16 tensor-core kernels against the scalar-tile kernels on the same bf16 inputs (the
// backwards on the same out and lse): they differ by P and dS rounded to bf16 as the tensor cores'
// operands and by the order of the sums. Prints the errors for the record.
using bf16 = __nv_bfloat16;
using jtok::cuda::AttnStrides;
using FwdFn = void (*)(bf16*, float*, const bf16*, const bf16*, const bf16*, int64_t, int64_t, int64_t, int64_t,
                       int64_t, cudaStream_t, AttnStrides);
using BwdFn =
    std::function<void(bf16*, bf16*, bf16*, float*, const bf16*, const bf16*, const float*, const bf16*, const bf16*,
                       const bf16*, int64_t, int64_t, int64_t, int64_t, int64_t, cudaStream_t, AttnStrides, bool)>;
// The tensor cores' backward without RoPE, as a BwdFn.
void tensor_core_backward(bf16* dq, bf16* dk, bf16* dv, float* row_terms, const bf16* dout, const bf16* out,
                          const float* lse, const bf16* q, const bf16* k, const bf16* v, int64_t B, int64_t T,
                          int64_t H, int64_t KV, int64_t hd, cudaStream_t s, AttnStrides strides, bool accumulate) {
  jtok::cuda::attention_backward<bf16>(dq, dk, dv, row_terms, dout, out, lse, q, k, v, B, T, H, KV, hd, s, strides,
                                       accumulate);
}

// out, lse of one forward; dq, dk, dv of one backward from the given out and lse.
Outputs bf16_forward(const AttnInputs& in, FwdFn run) {
  const auto [B, T, H, KV, hd] = in.s;
  auto q = upload<bf16>(in.q), k = upload<bf16>(in.k), v = upload<bf16>(in.v);
  DeviceBuffer<bf16> out(in.q.size());
  DeviceBuffer<float> lse(static_cast<size_t>(B * H * T));
  poison(out);
  poison(lse);
  run(out.get(), lse.get(), q.get(), k.get(), v.get(), B, T, H, KV, hd, nullptr, {});
  return {{"out", download(out)}, {"lse", download(lse)}};
}
Outputs bf16_backward(const AttnInputs& in, const Outputs& fwd, BwdFn run) {
  const auto [B, T, H, KV, hd] = in.s;
  auto q = upload<bf16>(in.q), k = upload<bf16>(in.k), v = upload<bf16>(in.v), dout = upload<bf16>(in.dout);
  auto out = upload<bf16>(fwd[0].second);
  auto lse = upload<float>(fwd[1].second);
  auto dq = upload<bf16>(in.dq0), dk = upload<bf16>(in.dk0), dv = upload<bf16>(in.dv0);
  DeviceBuffer<float> row_terms(static_cast<size_t>(B * H * T));
  run(dq.get(), dk.get(), dv.get(), row_terms.get(), dout.get(), out.get(), lse.get(), q.get(), k.get(), v.get(), B, T,
      H, KV, hd, nullptr, {}, true);
  return {{"dq", download(dq)}, {"dk", download(dk)}, {"dv", download(dv)}};
}

void expect_close(const Outputs& a, const Outputs& b, double tol, const char* what) {
  for (size_t i = 0; i < a.size(); ++i) {
    for (float x : a[i].second) ASSERT_TRUE(std::isfinite(x)) << what << " " << a[i].first;
    const double err = jtok::testing::rel_err(a[i].second, b[i].second);
    std::printf("tensor cores vs scalar tiles, %s %s: err %.3e (tol %.1e)\n", what, a[i].first.c_str(), err, tol);
    EXPECT_LT(err, a[i].first == "lse" ? 1e-5 : tol) << what << " " << a[i].first;  // lse: fp32 sums on both
  }
}

TEST(CudaAttentionBits, TensorCoresMatchScalarTiles) {
  for (int64_t hd : {32, 64, 128})
    for (int64_t kv : {4, 1}) {
      const auto in = make_inputs({2, 257, 4, kv, hd}, 21);
      const std::string what = "hd " + std::to_string(hd) + " kv " + std::to_string(kv);
      const Outputs tc = bf16_forward(*in, jtok::cuda::attention_forward<bf16>);
      const Outputs tiles = bf16_forward(*in, jtok::cuda::attention_forward_tiles<bf16>);
      expect_close(tc, tiles, 1e-2, what.c_str());
      expect_close(bf16_backward(*in, tiles, tensor_core_backward),
                   bf16_backward(*in, tiles, jtok::cuda::attention_backward_tiles<bf16>), 2e-2, what.c_str());
    }
}

// Every element's bits, a against b.
void expect_same_bits(const Outputs& a, const Outputs& b, const std::string& what) {
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].second.size(); ++j) {
      ASSERT_TRUE(std::isfinite(a[i].second[j])) << what << " " << a[i].first << " " << j;
      ASSERT_EQ(std::bit_cast<uint32_t>(a[i].second[j]), std::bit_cast<uint32_t>(b[i].second[j]))
          << what << " " << a[i].first << " " << j;
    }
}

// The backward with dq's 32 rows a warp, through RoPE's inverse at positions 0..T-1 when given tables.
BwdFn wide_backward(const jtok::cuda::RopeTables& rope) {
  return [rope](bf16* dq, bf16* dk, bf16* dv, float* row_terms, const bf16* dout, const bf16* out, const float* lse,
                const bf16* q, const bf16* k, const bf16* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                cudaStream_t s, AttnStrides strides, bool accumulate) {
    jtok::cuda::attention_backward_wide(dq, dk, dv, row_terms, dout, out, lse, q, k, v, B, T, H, KV, hd, s, strides,
                                        accumulate, rope);
  };
}
BwdFn narrow_backward(const jtok::cuda::RopeTables& rope) {
  return [rope](bf16* dq, bf16* dk, bf16* dv, float* row_terms, const bf16* dout, const bf16* out, const float* lse,
                const bf16* q, const bf16* k, const bf16* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                cudaStream_t s, AttnStrides strides, bool accumulate) {
    jtok::cuda::attention_backward<bf16>(dq, dk, dv, row_terms, dout, out, lse, q, k, v, B, T, H, KV, hd, s, strides,
                                         accumulate, rope);
  };
}

// The forward and dq with 32 query rows a warp (attention_forward_wide, attention_backward_wide) give
// attention_forward's and attention_backward's bits: each row's products, softmax and sums are the
// same arithmetic in the same order; the warps skip only key tiles past their rows (which add zeros).
// T 257: blocks of 128 rows and a last one of 1; 100: one block, rows past T; 200: the last block's
// second diagonal tile cut by T. hd 128 runs the 16-row kernels. The backward also through RoPE's
// inverse (dq's and dk's last stores), from made-up tables.
TEST(CudaAttentionBits, WideWarpsGiveTheSameBits) {
  for (const AttnShape& s : {AttnShape{2, 257, 4, 4, 64}, AttnShape{1, 100, 4, 1, 64}, AttnShape{1, 200, 2, 2, 32},
                             AttnShape{1, 130, 2, 2, 128}}) {
    const std::string what =
        "T " + std::to_string(s.T) + ", KV " + std::to_string(s.KV) + ", hd " + std::to_string(s.hd);
    const auto in = make_inputs(s, 500 + static_cast<uint64_t>(s.T + s.hd));
    const Outputs fwd = bf16_forward(*in, jtok::cuda::attention_forward<bf16>);
    expect_same_bits(fwd, bf16_forward(*in, jtok::cuda::attention_forward_wide), "forward, " + what);
    expect_same_bits(bf16_backward(*in, fwd, narrow_backward({})), bf16_backward(*in, fwd, wide_backward({})),
                     "backward, " + what);
    const auto cos = upload<float>(randn(s.T * s.hd / 2, 600)), sin = upload<float>(randn(s.T * s.hd / 2, 601));
    const jtok::cuda::RopeTables rope{cos.get(), sin.get()};
    expect_same_bits(bf16_backward(*in, fwd, narrow_backward(rope)), bf16_backward(*in, fwd, wide_backward(rope)),
                     "backward through RoPE, " + what);
  }
}

// Bad shapes are refused with a message naming the value (head dims: 32, 64, 128 only).
TEST(CudaAttentionBits, RefusesUnsupportedShapes) {
  for (int64_t hd : {16, 48, 96, 256}) {
    try {
      jtok::cuda::attention_forward<float>(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 4, 4, hd, nullptr);
      ADD_FAILURE() << "head dim " << hd << " was accepted";
    } catch (const jtok::Error& e) {
      EXPECT_NE(std::string(e.what()).find("head dim " + std::to_string(hd)), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(jtok::cuda::attention_forward<float>(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 4, 3, 64, nullptr),
               jtok::Error);
  const AttnStrides short_q{3 * 64, 0};  // q rows narrower than its 4 heads
  EXPECT_THROW(
      jtok::cuda::attention_forward<float>(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 4, 4, 64, nullptr, short_q),
      jtok::Error);
}

}  // namespace
