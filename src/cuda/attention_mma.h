// The bf16 attention on the tensor cores (mma.sync m16n8k16, fp32 accumulation), internal to
// src/cuda: attention_forward / attention_backward<__nv_bfloat16> (cuda/attention.h) run these; the
// layouts are that header's.
//   q (B,T,H,hd), k, v (B,T,KV,hd), out (B,T,H,hd) bf16, 16-byte aligned; lse (B,H,T) fp32.
#pragma once
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "core/error.h"

namespace jtok::cuda {

// The checked shape of one attention call (cuda/attention.cu check_dims): KV divides H; qs, kvs the
// token row strides of q (and dq) and of k, v (and dk, dv), in elements (cuda/attention.h AttnStrides).
struct AttnDims {
  int B, T, H, KV;
  int64_t qs, kvs;
  bool accumulate = true;  // the backward's dq, dk, dv: added into, or written over (never read)
  // The backward's dq and dk through RoPE's inverse before they are added or written (cuda/rope.h's
  // rope_backward on the fp32 sums, one rounding), from its (T, hd/2) tables at positions 0..T-1; null:
  // as the attention's inputs were given.
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
};

// The head dims the kernels are instantiated for: multiples of 32 (the scalar tiles give a lane
// hd / 32 columns) and so of 16 (an mma k-step) and 8 (a 16-byte bf16 copy).
constexpr bool attention_head_dim_supported(int64_t hd) { return hd == 32 || hd == 64 || hd == 128; }

// f(std::integral_constant<int, HD>{}) for the head dim hd: the one place a runtime hd becomes a
// kernel's template parameter.
template <typename F>
void with_head_dim(int64_t hd, F&& f) {
  switch (hd) {
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    default: fail("cuda attention: head dim ", hd, " is not supported (32, 64 or 128)");
  }
}

// f(std::integral_constant<int, MT>{}) for rows_per_warp query rows a warp at head dim HD: 16 is MT 1,
// 32 is MT 2 (two m16 tiles) where HD <= 64; hd 128 runs MT 1 either way (its two m-tiles' output,
// scores and fragments spill past 255 registers). Another rows_per_warp is refused, naming `what`.
template <int HD, typename F>
void with_m_tiles(int rows_per_warp, const char* what, F&& f) {
  JTOK_CHECK(rows_per_warp == 16 || rows_per_warp == 32, what, ": ", rows_per_warp, " query rows a warp (16 or 32)");
  if constexpr (HD <= 64) {
    if (rows_per_warp == 32) return f(std::integral_constant<int, 2>{});
  }
  f(std::integral_constant<int, 1>{});
}

// hd 32, 64 or 128, B, T > 0 (checked by the caller); pointers 16-byte aligned and strides
// multiples of 8 (checked here). rows_per_warp 16, or 32 (hd 32 and 64; hd 128 runs 16): the same bits.
void attention_forward_mma(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                           const __nv_bfloat16* v, const AttnDims& n, int hd, cudaStream_t stream,
                           int rows_per_warp = 16);

// dq (B,T,H,hd), dk, dv (B,T,KV,hd) += the gradients, or = them without n.accumulate
// (cuda/attention_mma_bwd.cu); row_terms (B,H,T) = sum_i dout_ti out_ti, already computed.
// dq_rows_per_warp 16, or 32 (hd 32 and 64; hd 128 runs 16): the same bits.
void attention_backward_mma(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv, const float* row_terms,
                            const __nv_bfloat16* dout, const float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                            const __nv_bfloat16* v, const AttnDims& n, int hd, cudaStream_t stream,
                            int dq_rows_per_warp = 16);

}  // namespace jtok::cuda
