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
#include "ops/q8_gemm.h"

namespace jtok {

bool lowp_gemm_enabled(Dtype t) {
  // oneDNN picks its bf16 kernels from the running CPU: without AVX-512 BF16 it would emulate them,
  // slower than converting weight panels for sgemm. int8: q8_gemm's vnni or avx2 tiles, as
  // q8_kernels() says (fallback: panels + sgemm). Decided from the CPU's flags, not timed, so a
  // given host always runs the same kernels (the same bits); JTOK_LOWP_GEMM=off keeps panels +
  // sgemm (a host whose bf16 arithmetic is no faster than fp32: measure with bench/prefill_ratio.sh).
  static const bool off = [] {
    const char* e = std::getenv("JTOK_LOWP_GEMM");
    return e != nullptr && std::string(e) == "off";
  }();
  static const bool bf16 = !off && __builtin_cpu_supports("avx512bf16");
  if (t == Dtype::bf16) return bf16;
  return t == Dtype::int8 && !off && q8_kernels() != Q8Kernels::fallback;
}

const char* lowp_gemm_kernel_name(Dtype t) {
  if (!lowp_gemm_enabled(t)) return "fp32 panels + sgemm";
  if (t == Dtype::bf16) return "oneDNN bf16 matmul (avx512_bf16)";
  return q8_kernels() == Q8Kernels::vnni ? "int8 x int8 tiles, input per block of 32 (avx512_vnni vpdpbusd)"
                                         : "int8 x int8 tiles, input per block of 32 (avx2 vpmaddubsw)";
}

std::string lowp_kernels_line(Dtype t, int64_t cols) {
  if (t == Dtype::f32) return "f32 weights: sgemm (up to 4 rows and every decoding step: register tiles)";
  const WeightMatrix w{t, nullptr, nullptr, 1, cols};
  return std::string(dtype_name(t)) + " weights: up to " + std::to_string(lowp_gemv_max_rows(w)) +
         " rows (and every decoding step) " + lowp_per_row_kernel_name(t, cols) + "; more rows " +
         lowp_gemm_kernel_name(t);
}

void lowp_gemm_input_ref(float* out, const float* x, Dtype t, int64_t N, int64_t C) {
  if (t == Dtype::bf16) {
    for (int64_t i = 0; i < N * C; ++i) out[i] = bf16_to_f32(f32_to_bf16(x[i]));
    return;
  }
  std::vector<int8_t> q(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c0 = 0; c0 < C; c0 += kActBlock) {  // per block of 32, as quantize_act_q8
      const int64_t len = std::min(kActBlock, C - c0);
      const float s = quantize_int8_span(q.data(), x + n * C + c0, len);
      for (int64_t c = 0; c < len; ++c) out[n * C + c0 + c] = static_cast<float>(q[c]) * s;
    }
}

namespace {

struct Key {
  int64_t N, OC, C;
  bool acc;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    return static_cast<size_t>(k.N) * 1000003u ^ static_cast<size_t>(k.OC) * 10007u ^ static_cast<size_t>(k.C) * 31u ^
           (k.acc ? 1u : 0u);
  }
};

// The bf16 primitive of a shape: src (N, C) bf16 compact; weights seen as (C, OC) with the stored
// (OC, C) rows' strides (no copy of ours; the library packs them per call, O(OC*C) against the
// product's O(N*OC*C)); dst (N, OC) f32 (accumulate: post-op sum).
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
    const dnnl::memory::desc src(dims{k.N, k.C}, dt::bf16, dims{k.C, 1});
    const dnnl::memory::desc wei(dims{k.C, k.OC}, dt::bf16, dims{1, k.C});
    const dnnl::memory::desc dst(dims{k.N, k.OC}, dt::f32, dims{k.OC, 1});
    dnnl::primitive_attr attr;
    if (k.acc) {
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
    run({N, OC, C, accumulate}, x16.data(), w.data, out);
    return;
  }
  q8_gemm(out, inp, w, N, accumulate);
}

}  // namespace jtok
