#include "ops/linear.h"

#include <oneapi/dnnl/dnnl.h>

#if defined(__AVX512BF16__)
// GCC 12's AVX-512 headers trip its own -Wmaybe-uninitialized (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#endif

#include <atomic>
#include <cstring>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/profile.h"
#include "ops/bf16_weights.h"
#include "ops/lowp_linear.h"

namespace jtok {

void gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  JTOK_CHECK(st == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(st));
}

static std::atomic<MatmulPrecision> g_precision{MatmulPrecision::fp32};

void set_matmul_precision(MatmulPrecision p) {
  JTOK_CHECK(p != MatmulPrecision::bf16 || bf16_matmul_supported(), "bf16 matmul needs AVX-512 BF16");
  g_precision = p;
}
MatmulPrecision matmul_precision() { return g_precision; }
bool bf16_matmul_supported() { return __builtin_cpu_supports("avx512bf16"); }

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (g_precision.load(std::memory_order_relaxed) == MatmulPrecision::bf16)
    gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    gemm_f32(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

namespace {

struct Bf16Key {
  bool ta, tb;
  int64_t M, N, K;
  float alpha, beta;
  bool operator==(const Bf16Key&) const = default;
};
struct Bf16KeyHash {
  size_t operator()(const Bf16Key& k) const {
    uint64_t h = static_cast<uint64_t>(k.M) * 1000003u ^ static_cast<uint64_t>(k.N) * 10007u ^ static_cast<uint64_t>(k.K);
    return h ^ (k.ta ? 1u : 0u) ^ (k.tb ? 2u : 0u) ^ std::hash<float>()(k.alpha) ^ (std::hash<float>()(k.beta) << 1);
  }
};

// One matmul primitive per (shape, transposes, alpha, beta), made on first use. A and B arrive
// compact (converted copies), C with its own row stride (ldc == N here: see gemm_bf16).
struct Bf16Prims {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  std::mutex mu;
  struct Prim {
    dnnl::matmul prim;
    dnnl::memory::desc a, b, c;
  };
  std::unordered_map<Bf16Key, Prim, Bf16KeyHash> prims;

  Prim get(const Bf16Key& k) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = prims.find(k);
    if (it != prims.end()) return it->second;
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    // Stored A: (M,K), or (K,M) when transposed; the primitive sees (M,K) with the matching strides.
    const dnnl::memory::desc a(dims{k.M, k.K}, dt::bf16, k.ta ? dims{1, k.M} : dims{k.K, 1});
    const dnnl::memory::desc b(dims{k.K, k.N}, dt::bf16, k.tb ? dims{1, k.K} : dims{k.N, 1});
    const dnnl::memory::desc c(dims{k.M, k.N}, dt::f32, dims{k.N, 1});
    dnnl::primitive_attr attr;
    if (k.alpha != 1.0f) attr.set_output_scales(0, {k.alpha});
    if (k.beta != 0.0f) {
      dnnl::post_ops po;
      po.append_sum(k.beta);
      attr.set_post_ops(po);
    }
    Prim p{dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, eng)), a, b, c};
    prims.emplace(k, p);
    return p;
  }
};
Bf16Prims& bf16_prims() {
  static Bf16Prims p;
  return p;
}

// rows x cols of src (row stride ld) in bf16, compact, in dst.
const uint16_t* round_bf16(std::vector<uint16_t>& dst, const float* src, int64_t rows, int64_t cols, int64_t ld) {
  JTOK_PROFILE("bf16_convert_act");
  dst.resize(static_cast<size_t>(rows * cols));
  quantize_bf16_rows(dst.data(), src, rows, cols, ld);
  return dst.data();
}

// Scratch for the rounded operands of this thread's products.
struct Bf16Scratch {
  std::vector<uint16_t> a, b, x, w;
};
thread_local Bf16Scratch t_scratch;

bool bf16_now() { return g_precision.load(std::memory_order_relaxed) == MatmulPrecision::bf16; }

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  const uint16_t* a16 = trans_a ? round_bf16(t_scratch.a, A, K, M, lda) : round_bf16(t_scratch.a, A, M, K, lda);
  const uint16_t* b16 = trans_b ? round_bf16(t_scratch.b, B, N, K, ldb) : round_bf16(t_scratch.b, B, K, N, ldb);
  gemm_bf16_rounded(trans_a, trans_b, M, N, K, alpha, a16, b16, beta, C, ldc);
}

void gemm_bf16_rounded(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A16,
                       const uint16_t* B16, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  thread_local std::vector<float> c32;
  // C with a row stride wider than N (a column block of a bigger matrix) goes through a compact copy.
  float* c = C;
  if (ldc != N) {
    c32.resize(static_cast<size_t>(M * N));
    if (beta != 0.0f)
      for (int64_t i = 0; i < M; ++i) std::memcpy(c32.data() + i * N, C + i * ldc, sizeof(float) * N);
    c = c32.data();
  }
  Bf16Prims& P = bf16_prims();
  const Bf16Prims::Prim p = P.get({trans_a, trans_b, M, N, K, alpha, beta});
  dnnl::stream strm(P.eng);
  // oneDNN reads the inputs only; its memory objects take non-const handles.
  dnnl::memory am(p.a, P.eng, const_cast<uint16_t*>(A16)), bm(p.b, P.eng, const_cast<uint16_t*>(B16)),
      cm(p.c, P.eng, c);
  p.prim.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  strm.wait();
  if (ldc != N)
    for (int64_t i = 0; i < M; ++i) std::memcpy(C + i * ldc, c32.data() + i * N, sizeof(float) * N);
}

void linear_forward(float* out, const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC) {
  const LinearProduct p{out, weight, OC, false};
  linear_forward_many(&p, 1, inp, N, C);
}

void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                     int64_t N, int64_t C, int64_t OC) {
  const LinearGrad p{dweight, dout, weight, OC};
  linear_backward_many(dinp, &p, 1, inp, N, C);
}

// The layers' products are timed by kind under JTOK_PROFILE (the bf16 roundings apart), so a
// training step's profile shows where fp32 and bf16 differ.
void linear_forward_many(const LinearProduct* p, int n, const float* inp, int64_t N, int64_t C) {
  if (N == 0) return;
  const bool bf16 = bf16_now();
  const uint16_t* x16 = bf16 ? round_bf16(t_scratch.x, inp, N, C, C) : nullptr;
  for (int i = 0; i < n; ++i) {
    const float beta = p[i].accumulate ? 1.0f : 0.0f;
    if (!bf16) {
      JTOK_PROFILE("linear fwd");
      gemm_f32(false, true, N, p[i].rows, C, 1.0f, inp, C, p[i].w, C, beta, p[i].out, p[i].rows);
      continue;
    }
    const uint16_t* w16 = bf16_weight(p[i].w, p[i].rows, C, t_scratch.w);
    JTOK_PROFILE("linear fwd");
    gemm_bf16_rounded(false, true, N, p[i].rows, C, 1.0f, x16, w16, beta, p[i].out, p[i].rows);
  }
}

void linear_backward_many(float* dinp, const LinearGrad* p, int n, const float* inp, int64_t N, int64_t C) {
  const bool bf16 = bf16_now() && N > 0;
  const uint16_t* x16 = nullptr;  // inp rounded once, on the first weight gradient
  for (int i = 0; i < n; ++i) {
    const int64_t OC = p[i].rows;
    const float* d = p[i].dout;
    if (!bf16) {
      if (dinp) { JTOK_PROFILE("linear bwd dinp"); gemm_f32(false, false, N, C, OC, 1.0f, d, OC, p[i].w, C, 1.0f, dinp, C); }
      if (p[i].dweight) { JTOK_PROFILE("linear bwd dweight"); gemm_f32(true, false, OC, C, N, 1.0f, d, OC, inp, C, 1.0f, p[i].dweight, C); }
      continue;
    }
    const uint16_t* d16 = round_bf16(t_scratch.a, d, N, OC, OC);  // for both products
    if (dinp) {
      const uint16_t* w16 = bf16_weight(p[i].w, OC, C, t_scratch.w);
      JTOK_PROFILE("linear bwd dinp");
      gemm_bf16_rounded(false, false, N, C, OC, 1.0f, d16, w16, 1.0f, dinp, C);
    }
    if (!p[i].dweight) continue;
    if (!x16) x16 = round_bf16(t_scratch.x, inp, N, C, C);
    JTOK_PROFILE("linear bwd dweight");
    gemm_bf16_rounded(true, false, OC, C, N, 1.0f, d16, x16, 1.0f, p[i].dweight, C);
  }
}

void linear_forward_ref(float* out, const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double acc = 0;
      for (int64_t c = 0; c < C; ++c) acc += static_cast<double>(inp[n * C + c]) * weight[o * C + c];
      out[n * OC + o] = static_cast<float>(acc);
    }
}

void linear_backward_ref(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                         int64_t N, int64_t C, int64_t OC) {
  if (dinp)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int64_t o = 0; o < OC; ++o) acc += static_cast<double>(dout[n * OC + o]) * weight[o * C + c];
        dinp[n * C + c] += static_cast<float>(acc);
      }
  for (int64_t o = 0; o < OC; ++o)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t n = 0; n < N; ++n) acc += static_cast<double>(dout[n * OC + o]) * inp[n * C + c];
      dweight[o * C + c] += static_cast<float>(acc);
    }
}

}  // namespace jtok
