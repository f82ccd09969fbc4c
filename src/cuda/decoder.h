// Decoding on the GPU (issue 40): a device copy of a CPU jtok::Model's backbone (bf16, or fp32: the
// checking instantiation), a paged KV cache in GPU memory and the token tables where the host keeps
// them, behind a plain C++ interface the CPU code calls (infer/decoder.cpp wraps it as a
// jtok::Decoder for `jtok generate / serve --device cuda`). The host Model stays the source of the
// weights and of the tables: rows reach the GPU as cuda/step_rows.h requests them (in place from
// registered host memory, or staged), or from a device copy (`hbm`, the control).
//   prefill: tokens (n) of one sequence appended at positions len..len+n-1 -> logits of the last (V)
//   decode:  one token of each of M sequences, each at its own position -> logits (M, V)
//   decode_digest: the same step -> each row's digest (cuda/logit_digest.h), computed on the device
//            right after the LM head; only the M digests come back (the host picks from them,
//            infer/token_pick.h), a row's logits on request (copy_row_logits)
// V = cfg.vocab_size (the real vocabulary, not the padded one). Logits come back to the host in fp32.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda/logit_digest.h"
#include "model/transformer.h"

namespace jtok::cuda {

struct DecoderSettings {
  bool bf16 = true;            // weights and activations in bf16 (fp32 accumulate); false: fp32 throughout
  bool kv_bf16 = true;         // KV pages in bf16; false: fp32
  int64_t max_batch = 16;      // sequences one decode call takes at most
  int64_t max_prefill = 512;   // tokens one prefill call takes at most (sizes the activations)
  int64_t kv_tokens = 0;       // KV positions over all open sequences (the page pool); 0 = max_batch x context
  int64_t page_tokens = 16;    // positions a KV page holds
  int64_t max_seqs = 0;        // sequences open at once (forks included); 0 = 4 x max_batch
  // Where a step's token-table rows come from: "hbm" (a device copy of every table, made at load),
  // "in_place" (the host's f32 / bf16 tables registered where they lie, read over UVA), "staged" (the
  // host's own gather into pinned staging, copied on a side stream: any storage, the disk store's
  // path), "auto" (in_place where every table allows it, else staged).
  std::string table_rows = "auto";
  // Decode steps replayed as CUDA graphs, one a (batch bucket, length bucket) captured on its first
  // use; off: every step launched kernel by kernel (the same shapes and bits). Paths that need the
  // host inside a step (staged rows) and profiling run eagerly anyway.
  bool cuda_graphs = true;
  // Time each decode step's phases (last_step()); eager. JTOK_PROFILE=1 in the environment sets it.
  bool profile = false;
  // Programmatic dependent launch in the decode steps' graphs (cuda/pdl_edges.h: a kernel's blocks
  // launch while the kernel before it finishes, the same bits); off until a GPU has measured it.
  bool pdl = false;
  // The decode steps' bf16 products on the tensor cores (cuda/row_invariant_mma.h: q | k | v, o, gate |
  // up, down and the LM head; each row's bits still its own, but not the CUDA-core kernel's); off:
  // row_invariant_linear's CUDA-core FMAs. bf16 only; an int8 export's int8 products, MoE's grouped
  // experts and JTok-M's router stay on the CUDA cores. Off until a GPU has measured it.
  bool tensor_cores = false;
  // An int8 export (`jtok export --weight-dtype int8`): decode steps read its int8 matrices as stored
  // (cuda/row_invariant_linear.h's _q8 products: half of bf16's bytes, each weight q * scale in fp32)
  // beside the copy in E that prefills multiply (cuBLASLt); off: the copy in E alone. MoE's routers
  // and JTok-M's read the copy either way (never low precision).
  bool int8_decode = true;
  // With int8_decode, an int8 export's matrices (the layers', the LM head, the embedding) held in int8
  // alone, no copy in E (about half the weights' GPU memory): a prefill (any step but a decode step)
  // dequantises each layer's matrices into one layer's scratch just before its products
  // (cuda/q8_dequant.h: the copy's bits), the embedding's rows are dequantised as gathered (the
  // copy's bits), the head's logits come from its int8 product for any rows. Refused for a model
  // that is not an int8 export.
  bool int8_only = false;
};

// The last decode step's phases (settings.profile or JTOK_PROFILE=1 in the environment: the step
// runs eagerly with cudaEvents between its phases), in ms. GPU times on the decoder's stream, summed
// over the layers: embed (from the step's start to layer 0: the ids up, the rows' request, the
// embedding), attention (each layer's norm, routing, q/k/v, RoPE, pages, attention, output
// projection), rows_wait (the stream stalled on each layer's token-table rows), mlp (the MLP halves
// without those waits), head (final norm and LM head), digest (decode_digest's logit digests; 0 for
// decode), logits_copy (to the host: decode's logits, or decode_digest's digests); step from the
// step's first event to that copy's end (the sum of the above). The rows' side stream:
// rows_dedup (the ids' dedup) and rows_gather (from the dedup's end to the last layer's rows;
// staged: the host functions' gathers and the copies). Host: rows_issue (queuing the requests; staged
// too: the ids' host dedup, the gathers only queued) and host (the whole decode call).
// rows_wait well under rows_dedup + rows_gather is the overlap issue 40 asks to see.
struct StepBreakdown {
  bool valid = false;  // false: not profiling, a CPU decoder, or no decode step yet
  int64_t rows = 0;     // the step's rows (its M padded to the batch bucket)
  int64_t max_len = 0;  // the positions its attention was launched for (the length bucket)
  double step_ms = 0, embed_ms = 0, attention_ms = 0, rows_wait_ms = 0, mlp_ms = 0, head_ms = 0, digest_ms = 0;
  double logits_copy_ms = 0;
  double rows_dedup_ms = 0, rows_gather_ms = 0;
  double rows_issue_ms = 0, host_ms = 0;
};

// Logits of positions pos..pos+n-1 (n, V) of the sequence being prefilled, handed over in blocks
// (infer/generate.h's PositionLogits).
using RowLogits = std::function<void(int64_t pos, int64_t n, const float* logits)>;

class DeviceDecoder {
 public:
  virtual ~DeviceDecoder() = default;
  // One line: the GPU, dtype, KV pages, where the rows come from, CUDA graphs on (or why off).
  virtual std::string describe() const = 0;
  // A new, empty sequence with room for `capacity` positions (pages reserved now): its handle.
  // Throws jtok::Error naming the pages asked and free when the pool cannot hold it.
  virtual int64_t open(int64_t capacity) = 0;
  virtual void close(int64_t seq) = 0;  // its pages back to the pool
  // A new sequence holding seq's positions (n choices; the pages seq shares mapped, its own copied),
  // room for `capacity` positions.
  virtual int64_t fork(int64_t seq, int64_t capacity) = 0;
  virtual int64_t length(int64_t seq) const = 0;
  // Prefix blocks as shared pages (cuda/kv_pages.h): keep_block makes seq's written positions
  // [first, first + n) (first and n multiples of page_tokens()) a block holding their pages;
  // open_from_blocks maps blocks' pages, read-only, as a new sequence's first positions (its length)
  // and reserves pages of its own for the rest of capacity; a page is freed when its last holder,
  // sequence or block, lets it go. Never a copy: a sequence writes only past its shared positions.
  virtual int64_t keep_block(int64_t seq, int64_t first, int64_t n) = 0;
  virtual void drop_block(int64_t block) = 0;
  virtual int64_t open_from_blocks(const std::vector<int64_t>& blocks, int64_t capacity) = 0;
  virtual int64_t page_tokens() const = 0;
  virtual int64_t free_pages() const = 0;  // pages nothing holds
  // Appends tokens[0..n) (n <= max_prefill) to seq; last_logits (V) gets the last one's logits;
  // each (optional) every position's.
  virtual void prefill(int64_t seq, const int32_t* tokens, int64_t n, float* last_logits,
                       const RowLogits& each = {}) = 0;
  // One step of M <= max_batch distinct sequences: tokens[i] appended to seqs[i]; logits (M, V).
  // Returns the token-table rows read (as the CPU's decode_batch counts them).
  virtual int64_t decode(const int64_t* seqs, const int32_t* tokens, int64_t M, float* logits) = 0;
  // The same step, but out (M) gets each row's digest (rows[i]: row i's inputs) and no logits come
  // back; they stay on the device, and copy_row_logits(i, out (V)) copies row i's back (a row its
  // digest does not settle), until the next decode, decode_digest or prefill.
  virtual int64_t decode_digest(const int64_t* seqs, const int32_t* tokens, int64_t M, const DigestRow* rows,
                                LogitDigest* out) = 0;
  virtual void copy_row_logits(int64_t i, float* out) = 0;
  // The last decode step's breakdown (valid only when profiling: settings.profile, JTOK_PROFILE=1).
  virtual StepBreakdown last_step() const { return {}; }
  // The kernels of the CUDA graph the last decode step replayed; 0 when it ran eagerly.
  virtual int64_t last_graph_kernels() const { return 0; }
  // Its programmatic edges (settings.pdl); 0 without.
  virtual int64_t last_graph_pdl_edges() const { return 0; }
};

// The decoder for host's model on device 0. Refuses, naming it, what the GPU decoder does not run.
// Without CUDA: require_cuda_device()'s error.
std::unique_ptr<DeviceDecoder> make_device_decoder(const Model& host, const DecoderSettings& s);

}  // namespace jtok::cuda
