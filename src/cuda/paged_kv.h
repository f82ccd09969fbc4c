// The paged KV cache's kernels (issue 40): per layer a K pool and a V pool (n_pages, page_tokens, KV,
// hd) of KvT (float or __nv_bfloat16), position p of a sequence at page table[p / page_tokens], slot
// p % page_tokens (cuda/kv_pages.h keeps the tables on the host). A step's R rows each belong to one
// sequence (row_seq[r]: the row of `page_tables`, (n_seqs, max_pages) int32, that lists its pages) at
// one position (pos[r]); a prefill's rows are consecutive positions of one sequence, a decode step's
// one row per sequence. Scale 1/sqrt(hd), fp32 softmax and sums, q head h reads kv head h / (H / KV)
// (ops/attention.h's decode contract: attention_decode is the CPU twin).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/decoder_sizes.h"

namespace jtok::cuda {

struct PagedKv {
  void* k = nullptr;  // (n_pages, page_tokens, KV, hd) of KvT
  void* v = nullptr;
  int64_t page_tokens = 16, KV = 0, hd = 0;
};
// Where a step's rows sit: (R) each, device int32.
struct PagedRows {
  const int32_t* row_seq = nullptr;      // the row of page_tables holding the row's sequence's pages
  const int32_t* pos = nullptr;          // the row's position in its sequence
  const int32_t* page_tables = nullptr;  // (n_seqs, max_pages) page ids
  int64_t max_pages = 0, R = 0;
};

// A step's fused projection rows q | k | v (R rows of ld >= (H + 2 KV) hd elements, of E) made ready
// for the attention in one kernel: each q and k head normalised by its per-head RMSNorm (q_norm,
// k_norm (hd) gains; both null: none, models without qk_norm) and rotated at its row's position (cos,
// sin (T, hd/2) fp32, row pos[r]: cuda/rope.h's rotation), then q (R, H hd), k, v (R, KV hd) packed,
// and k, v into the pages at each row's position (E -> KvT rounds to nearest even; the same type
// copies the bits). The bits are rmsnorm_forward's over the heads, then RoPE's, then the copies'.
template <typename E>
struct QkvRows {
  const E* qkv = nullptr;  // (R, ld)
  int64_t ld = 0, H = 0;
  const E *q_norm = nullptr, *k_norm = nullptr;
  float eps = 0.0f;
  const float *cos = nullptr, *sin = nullptr;
};
template <typename E>
struct QkvOut {
  E *q = nullptr, *k = nullptr, *v = nullptr;
};
template <typename E, typename KvT>
void paged_qkv(const QkvOut<E>& out, const QkvRows<E>& in, const PagedKv& kv, const PagedRows& rows,
               cudaStream_t stream);

// kPagedAttentionChunk, the positions a flash-decoding chunk of paged_attention covers (its grid has
// ceil(max_len / it) chunks a (row, kv head), those past a row's own chunks returning at once), and
// paged_attention_scratch, the floats of scratch it needs, are cuda/decoder_sizes.h's (plain C++:
// the decoder's memory plan sizes the scratch too).
// q (R rows of q_stride elements, H*hd each) of E: row r attends to positions 0..pos[r] of its
// sequence (paged_qkv has written them, pos[r] itself included) -> out (R, H, hd) packed, of E.
// Long rows are split into chunks of positions whose partial softmax states are combined in chunk
// order: the chunking depends on the row's own position only, so a row's bits do not depend on the
// other rows of the step (batch invariance) and no float atomics decide bits. hd 32, 64 or 128, KV
// divides H, the pools 16-byte aligned (refused by value otherwise); a row with pos[r] + 1 outside
// 1..max_len reads nothing and gets NaN. cuda/paged_kv.cu gives the launch shapes.
// scratch: any number of floats holding at least one row's paged_attention_scratch(1, H, hd,
// max_len) (refused by value otherwise); the rows run in groups of as many as it holds, with the
// bits of one launch. counters (R H int32): zero before the first call, and each call leaves them
// zero (the combine's arrival counts; cuda/paged_kv.cu).
struct PagedScratch {
  float* data = nullptr;
  int64_t floats = 0;
};
template <typename E, typename KvT>
void paged_attention(E* out, const E* q, int64_t q_stride, const PagedKv& kv, const PagedRows& rows, int64_t H,
                     int64_t max_len, const PagedScratch& scratch, int32_t* counters, cudaStream_t stream);

}  // namespace jtok::cuda
