// Causal grouped-query flash attention on the GPU (FlashAttention-2's algorithm): the layouts, the
// scale 1/sqrt(hd) and the saved row log-sum-exp of the CPU engine's ops/attention.h, so a (B,T,...)
// buffer means the same thing on both devices. q head h reads kv head h / (H / KV).
//   q (B,T,H,hd), k and v (B,T,KV,hd), out (B,T,H,hd); lse (B,H,T) fp32.
// hd is 32, 64 or 128. Elements are float (the checking instantiation) or __nv_bfloat16 (the fast path);
// every sum is fp32. No T x T buffer; no atomics (a run is bitwise reproducible).
// RoPE and QK-norm are separate ops (cuda/rope.h, cuda/rmsnorm.h), but that the bf16 backward writes
// dq and dk through RoPE's inverse when given its tables (RopeTables), saving rope_backward's read and
// write of them a layer; fusing RoPE into the q / k tile loads of the forward (and of the backward's
// recomputed scores) would save the forward's: worth it once timings show that kernel.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/attention_rows.h"

namespace jtok::cuda {

// Token row strides in elements (0: packed): q and dq q, k, v, dk and dv kv; out and dout are always
// packed (B,T,H,hd). Packed tensors are q H*hd, kv KV*hd; q, k and v inside one fused qkv row
// (B,T,(H+2KV)*hd) are q = kv = (H+2KV)*hd with k = q + H*hd, v = k + KV*hd (cuda/rope.h's
// `stride`). The bf16 kernels need multiples of 8 (16-byte rows).
struct AttnStrides {
  int64_t q = 0, kv = 0;
};

// out (B,T,H,hd), lse (B,H,T) = log sum_j<=t exp(q_t . k_j / sqrt(hd)) per row, both overwritten.
// bf16 runs on the tensor cores (cuda/attention_mma.cu; q, k, v, out 16-byte aligned); fp32 on the
// scalar tiles below.
template <typename E>
void attention_forward(E* out, float* lse, const E* q, const E* k, const E* v, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t hd, cudaStream_t stream, AttnStrides strides = {});

// The bf16 tensor-core forward with 32 query rows a warp where attention_forward gives each warp 16
// (hd 32 and 64; hd 128 runs attention_forward's): two m16 tiles share each key and value fragment
// read from shared memory (FlashAttention-2's layout), half the shared-memory reads a product, at
// twice the registers. The same bits as attention_forward. bench_cuda_attention times both; a training
// model times both on its own shape and runs the faster (pick_attention_rows below).
void attention_forward_wide(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                            const __nv_bfloat16* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                            cudaStream_t stream, AttnStrides strides = {});

// The same on scalar fp32 tiles for either type: the tensor-core forward's peer in the tests.
template <typename E>
void attention_forward_tiles(E* out, float* lse, const E* q, const E* k, const E* v, int64_t B, int64_t T, int64_t H,
                             int64_t KV, int64_t hd, cudaStream_t stream, AttnStrides strides = {});

// RoPE's tables (cuda/rope.h's cos, sin: rows of hd / 2 for positions 0..T-1 at least).
struct RopeTables {
  const float* cos = nullptr;
  const float* sin = nullptr;
};

// dq (B,T,H,hd), dk, dv (B,T,KV,hd) are accumulated into (+=), as the CPU's attention_backward, or
// with accumulate false written over (their old values never read: the same bits as zeroing them
// first, without the pass over them). Given rope (and bf16), dq's and dk's parts go through RoPE's
// inverse first, in fp32 (rope_backward's rotation before their one rounding): the gradients of q and k
// before RoPE; returns whether it did so (fp32 does not: the caller runs rope_backward).
// out and lse are the forward's. row_terms (B,H,T) fp32 is scratch: D_t = sum_i dout_ti out_ti.
// dk and dv of a kv head sum over its group's query heads in a fixed order (one block per key tile).
// bf16 runs on the tensor cores (cuda/attention_mma_bwd.cu; q, k, v, dout and the gradients 16-byte
// aligned); fp32 on the scalar tiles below.
template <typename E>
bool attention_backward(E* dq, E* dk, E* dv, float* row_terms, const E* dout, const E* out, const float* lse,
                        const E* q, const E* k, const E* v, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                        cudaStream_t stream, AttnStrides strides = {}, bool accumulate = true,
                        const RopeTables& rope = {});
// The bf16 tensor-core backward with dq's 32 query rows a warp where attention_backward's dq gives each
// warp 16 (hd 32 and 64; hd 128 runs attention_backward's): two m16 tiles share each key and value
// fragment read from shared memory, at twice the registers. dk dv as attention_backward's. The same bits
// as attention_backward. bench_cuda_attention times both; a training model times both on its own shape
// and runs the faster (pick_attention_rows below).
bool attention_backward_wide(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv, float* row_terms,
                             const __nv_bfloat16* dout, const __nv_bfloat16* out, const float* lse,
                             const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int64_t B,
                             int64_t T, int64_t H, int64_t KV, int64_t hd, cudaStream_t stream,
                             AttnStrides strides = {}, bool accumulate = true, const RopeTables& rope = {});
// The same on scalar fp32 tiles for either type: the tensor-core backward's peer in the tests.
template <typename E>
void attention_backward_tiles(E* dq, E* dk, E* dv, float* row_terms, const E* dout, const E* out, const float* lse,
                              const E* q, const E* k, const E* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                              int64_t hd, cudaStream_t stream, AttnStrides strides = {}, bool accumulate = true);

// Times the bf16 forward and backward at 16 and at 32 query rows a warp on one layer's buffers (q, k, v
// and dout read; out, lse, dq, dk, dv and row_terms written over, their values not kept) at (B, T, H, KV,
// hd) with the model's strides and RoPE tables, and picks the faster of each (a tie: 16). hd 128: 16
// and 16, untimed. Waits for the stream (cudaEvents).
AttentionRows pick_attention_rows(__nv_bfloat16* out, float* lse, __nv_bfloat16* dq, __nv_bfloat16* dk,
                                  __nv_bfloat16* dv, float* row_terms, const __nv_bfloat16* dout,
                                  const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int64_t B,
                                  int64_t T, int64_t H, int64_t KV, int64_t hd, cudaStream_t stream,
                                  AttnStrides strides, const RopeTables& rope);

}  // namespace jtok::cuda
