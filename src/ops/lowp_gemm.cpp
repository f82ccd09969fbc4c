#include "ops/lowp_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "ops/linear.h"

namespace jtok {

bool lowp_gemm_enabled(Dtype t) {
  // oneDNN picks its kernels from the running CPU: without these instructions it would emulate
  // them, slower than converting weight panels for sgemm. Decided from the CPU's flags, not timed,
  // so a given host always runs the same kernels (the same bits); JTOK_LOWP_GEMM=off keeps panels +
  // sgemm (a host whose bf16 arithmetic is no faster than fp32: measure with bench/prefill_ratio.sh).
  static const bool off = [] {
    const char* e = std::getenv("JTOK_LOWP_GEMM");
    return e != nullptr && std::string(e) == "off";
  }();
  static const bool bf16 = !off && __builtin_cpu_supports("avx512bf16");
  static const bool int8 = !off && __builtin_cpu_supports("avx512vnni");
  return t == Dtype::bf16 ? bf16 : t == Dtype::int8 ? int8 : false;
}

const char* lowp_gemm_kernel_name(Dtype t) {
  if (!lowp_gemm_enabled(t)) return "fp32 panels + sgemm";
  return t == Dtype::bf16 ? "oneDNN bf16 matmul (avx512_bf16)" : "oneDNN s8 matmul, int32 sums (avx512_vnni)";
}

void quantize_act_rows_q8(int8_t* q, float* scale, const float* x, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= (1 << 16))
  for (int64_t n = 0; n < N; ++n) scale[n] = quantize_int8_span(q + n * C, x + n * C, C);
}

void lowp_gemm_input_ref(float* out, const float* x, Dtype t, int64_t N, int64_t C) {
  if (t == Dtype::bf16) {
    for (int64_t i = 0; i < N * C; ++i) out[i] = bf16_to_f32(f32_to_bf16(x[i]));
    return;
  }
  std::vector<int8_t> q(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n) {
    const float s = quantize_int8_span(q.data(), x + n * C, C);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = static_cast<float>(q[c]) * s;
  }
}

namespace {

using Int32Alias = int32_t __attribute__((may_alias));  // int32 sums written over the float output

struct Key {
  Dtype dt;
  int64_t N, OC, C;
  bool acc;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    return static_cast<size_t>(k.N) * 1000003u ^ static_cast<size_t>(k.OC) * 10007u ^ static_cast<size_t>(k.C) * 31u ^
           static_cast<size_t>(k.dt) << 1 ^ (k.acc ? 1u : 0u);
  }
};

// The primitive of a shape: src (N, C) bf16 / s8 compact; weights seen as (C, OC) with the stored
// (OC, C) rows' strides (no copy of ours; the library packs them per call, O(OC*C) against the
// product's O(N*OC*C)); dst (N, OC) f32 (bf16, accumulate: post-op sum) or s32 (int8, scaled after).
struct Prim {
  dnnl::matmul prim;
  dnnl::memory::desc src, wei, dst;
};

struct Prims {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  std::mutex mu;
  std::unordered_map<Key, Prim, KeyHash> prims;

  Prim get(const Key& k) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = prims.find(k);
    if (it != prims.end()) return it->second;
    if (prims.size() >= 4096) prims.clear();  // a server's every prefill length: bounded
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    const bool b16 = k.dt == Dtype::bf16;
    const dnnl::memory::desc src(dims{k.N, k.C}, b16 ? dt::bf16 : dt::s8, dims{k.C, 1});
    const dnnl::memory::desc wei(dims{k.C, k.OC}, b16 ? dt::bf16 : dt::s8, dims{1, k.C});
    const dnnl::memory::desc dst(dims{k.N, k.OC}, b16 ? dt::f32 : dt::s32, dims{k.OC, 1});
    dnnl::primitive_attr attr;
    if (b16 && k.acc) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    Prim p{dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), attr, eng)), src, wei, dst};
    prims.emplace(k, p);
    return p;
  }
};
Prims& prims() {
  static Prims p;
  return p;
}

void run(const Key& k, void* src, const void* wei, void* dst) {
  Prims& P = prims();
  const Prim p = P.get(k);
  dnnl::stream strm(P.eng);
  dnnl::memory sm(p.src, P.eng, src), wm(p.wei, P.eng, const_cast<void*>(wei)), dm(p.dst, P.eng, dst);
  p.prim.execute(strm, {{DNNL_ARG_SRC, sm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, dm}});
  strm.wait();
}

}  // namespace

void lowp_gemm(float* out, const float* inp, const WeightMatrix& w, int64_t N, bool accumulate) {
  JTOK_CHECK(w.dtype == Dtype::bf16 || w.dtype == Dtype::int8, "lowp_gemm: bf16 or int8 weights only");
  if (N <= 0) return;
  const int64_t OC = w.rows, C = w.cols;
  if (w.dtype == Dtype::bf16) {
    thread_local std::vector<uint16_t> x16;
    x16.resize(static_cast<size_t>(N * C));
    quantize_bf16_rows(x16.data(), inp, N, C, C);
    run({w.dtype, N, OC, C, accumulate}, x16.data(), w.data, out);
    return;
  }
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xs;
  thread_local std::vector<int32_t> acc32;
  xq.resize(static_cast<size_t>(N * C));
  xs.resize(static_cast<size_t>(N));
  quantize_act_rows_q8(xq.data(), xs.data(), inp, N, C);
  // The int32 sums go to out itself unless out is accumulated into (an LM head's N x V sums would
  // otherwise need a second buffer of that size), then are scaled in place, element by element.
  Int32Alias* a = reinterpret_cast<Int32Alias*>(out);
  if (accumulate) {
    acc32.resize(static_cast<size_t>(N * OC));
    a = reinterpret_cast<Int32Alias*>(acc32.data());
  }
  run({w.dtype, N, OC, C, false}, xq.data(), w.data, a);
  // out[n, o] (+)= sum * x scale[n] * w scale[o]: exact int32 sums, scaled once.
  const float* ws = w.scale;
  const float* xsp = xs.data();
#pragma omp parallel for schedule(static) if (N * OC >= (1 << 15))
  for (int64_t n = 0; n < N; ++n) {
    float* o = out + n * OC;
    const Int32Alias* an = a + n * OC;
    const float s = xsp[n];
    if (accumulate) {
#pragma omp simd
      for (int64_t j = 0; j < OC; ++j) o[j] += static_cast<float>(an[j]) * (s * ws[j]);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < OC; ++j) o[j] = static_cast<float>(an[j]) * (s * ws[j]);
    }
  }
}

}  // namespace jtok
