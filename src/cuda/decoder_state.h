// The GPU decoder's state (cuda/decoder.h; the class is cuda/decoder.cu's): the backbone's weights on
// the device (one flat copy of host.params in E, viewed through the GPU model's layout: no
// gradients, no fp32 master in bf16, no tables), the paged KV cache (cuda/kv_pages.h's bookkeeping,
// cuda/paged_kv.h's pools), one step's buffers for up to max_rows rows, and where the step's
// token-table rows come from (cuda/step_rows.h: hbm, in place or staged), the decode steps' CUDA
// graphs and the step profile. Set up by cuda/decoder_setup.cu, run by cuda/decoder_forward.cu (a
// decode step by cuda/decoder_step.cu). E: float (the checking instantiation) or
// __nv_bfloat16; the KV pages' type is a run-time choice (settings.kv_bf16).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/decoder.h"
#include "cuda/decoder_profile.h"
#include "cuda/decoder_sizes.h"
#include "cuda/device.h"
#include "cuda/device_array.h"
#include "cuda/jtokm.h"
#include "cuda/kv_pages.h"
#include "cuda/matmul.h"
#include "cuda/model.h"
#include "cuda/model_moe.h"
#include "cuda/paged_kv.h"
#include "cuda/q8_dequant.h"
#include "cuda/row_invariant_linear.h"
#include "cuda/step_rows.h"
#include "model/transformer.h"

namespace jtok::cuda {

// A non-blocking stream owned by the decoder: synchronised and destroyed last.
struct OwnedStream {
  cudaStream_t s = nullptr;
  OwnedStream() { JTOK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream() {
    if (!s) return;
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
};

// The paged KV cache: per layer a K pool and a V pool (n_pages + 1, page_tokens, KV, hd) of KvT,
// back to back in one allocation (layer l's K at 2l, its V at 2l + 1); the host's page tables and
// their device copy (max_seqs + 1, max_pages), a sequence's row rewritten when it opens or forks.
// Page n_pages and table row max_seqs are the scratch sequence's, no KvPages handle's: a decode
// step's dummy rows (its M sequences padded to the batch bucket) write and read position 0 there.
struct DecoderKv {
  bool bf16 = true;
  int64_t n_pages = 0, page_tokens = 0, max_pages = 0, max_seqs = 0, layers = 0, KV = 0, hd = 0;
  DeviceArray<uint8_t> pool;
  std::unique_ptr<KvPages> pages;
  std::vector<int32_t> tables_host;  // (max_seqs + 1, max_pages): a sequence's pages, 0 past them
  DeviceArray<int32_t> tables;       // the same on the device
  int64_t scratch_row() const { return max_seqs; }
  int32_t scratch_page() const { return static_cast<int32_t>(n_pages); }
  size_t elem_bytes() const { return bf16 ? 2 : 4; }
  size_t page_bytes() const { return static_cast<size_t>(page_tokens * KV * hd) * elem_bytes(); }
  // One K or V pool: the n_pages pages KvPages hands out and the scratch page.
  size_t pool_bytes() const { return static_cast<size_t>(n_pages + 1) * page_bytes(); }
  PagedKv layer(int64_t l) const {
    uint8_t* base = pool.get() + static_cast<size_t>(2 * l) * pool_bytes();
    return {base, base + pool_bytes(), page_tokens, KV, hd};
  }
};

// One step's buffers, max_rows rows (decode: one a sequence; prefill: one a position). The residual
// stream h runs in place through every layer (as the CPU's decode); x holds either norm's output.
template <typename E>
struct DecoderActs {
  int64_t max_rows = 0, head_rows = 0;
  DeviceArray<E> h, a, x, q, k, v, att;       // (R,d) x3, (R,qd), (R,kvd) x2, (R,qd)
  DeviceArray<E> qkv;                         // (R, qd + 2 kvd) the projections before norm and RoPE
  DeviceArray<E> gate_up, act;                // (R, 2F) gate | up, (R,F) dense MLP layers
  DeviceArray<E> mlp_out, nrows;              // JTok (gated): the ungated update, the normed rows (R,d)
  DeviceArray<float> rstd, inv_norm;          // (R), (R)
  DeviceArray<float> lse, attn_scratch;       // a fresh prefill's (H, R); paged_attention's
  DeviceArray<int32_t> attn_counters;         // (R, H) paged_attention's, zero between its calls
  // JTok-M (fp32): router logits and the arrays of cuda/jtokm.h's JTokMDeviceActs that jtokm_route and
  // the mix use (not training's statistics), shared by the layers.
  DeviceArray<float> m_logits, m_sig, m_w, m_inv_norm;  // (R,n_e) (R,n_e) (R,K) (R)
  DeviceArray<int32_t> m_sel;                           // (R,K)
  DeviceMoeActs<E> moe;                       // MoE layers (shared: no backward)
  DeviceMoeScratch<E> moe_scratch;            // only logits and group sized (the forward's)
  DeviceArray<int32_t> step;                  // (3, max_rows): ids, row_seq, pos
  DeviceArray<int32_t> identity;              // (max_rows) 0, 1, 2, ...: JTok's rows are the unique ids'
  DeviceArray<E> lnf;                         // (head_rows, d) final norm of the rows whose logits are asked
  DeviceArray<float> logits;                  // (head_rows, Vp)
  PinnedArray<int32_t> host_step;             // (3, max_rows): the step's ints, one copy up
  PinnedArray<float> host_logits;             // (head_rows, V): the logits' real columns, copied back
  PinnedArray<int32_t> host_sel;              // (JTok-M layers, max_batch, K): a decode's choices
  DeviceArray<DigestRow> digest_rows;         // (max_batch) a decode_digest step's rows' inputs
  DeviceArray<LogitDigest> digests;           // (max_batch) its rows' digests (cuda/logit_digest.h)
  PinnedArray<DigestRow> host_digest_rows;    // (max_batch) the inputs, one copy up
  PinnedArray<LogitDigest> host_digests;      // (max_batch) the first M digests, copied back
  int32_t* ids() const { return step.get(); }
  int32_t* row_seq() const { return step.get() + max_rows; }
  int32_t* pos() const { return step.get() + 2 * max_rows; }
  JTokMDeviceActs jtokm() const { return {m_sig.get(), m_sel.get(), m_w.get(), m_inv_norm.get()}; }
};

// A decode step's launch shape (cuda/decode_buckets.h): R rows, paged attention for max_len
// positions, and whether it ends in the logit digests (decode_digest) or not (decode).
using DecodeShape = std::tuple<int64_t, int64_t, bool>;

// The decode steps' CUDA graphs, one instantiated graph a shape (cuda/decoder_step.cu captures them).
class DecodeGraphs {
 public:
  DecodeGraphs() = default;
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;
  struct Captured {
    cudaGraphExec_t exec = nullptr;
    int64_t kernels = 0;    // the graph's kernel nodes
    int64_t pdl_edges = 0;  // its programmatic edges (settings.pdl)
  };
  Captured find(const DecodeShape& shape) const;  // exec null: not captured yet
  void add(const DecodeShape& shape, const Captured& graph);  // exec owned from now on
  size_t size() const { return graphs_.size(); }

 private:
  std::map<DecodeShape, Captured> graphs_;
};

// An int8 export's matrices as stored, for the decode steps' products (settings.int8_decode): one
// run of int8 values and one of their rows' scales, laid out as decoder_q8_sizes counts them (per
// layer q | k | v, o, then a dense layer's gate | up, down, or an MoE layer's experts, each expert's
// gate | up then down, and its shared experts' gate | up, down; the LM head last). A layer's gate_up
// and down are null on MoE layers, its moe's on dense ones; on() false: none (not an int8 export, or
// int8_decode off).
struct DecoderQ8 {
  struct Layer {
    Q8Weight qkv, o, gate_up, down;
    MoeQ8 moe;
    // The layer's int8 values and its rows' scales (from first_value, first_row; rows of them) and
    // its runs of rows of one width (runs[run_begin ..]): what an int8_only prefill dequantises into
    // the scratch.
    int64_t first_value = 0, first_row = 0, rows = 0, run_begin = 0, runs = 0;
  };
  // One host matrix among the values: its slot in host.params, its first value here, its layer (-1:
  // the LM head or the embedding).
  struct Part {
    int64_t host_offset = 0, numel = 0, value_offset = 0, layer = -1;
  };
  DeviceArray<int8_t> values;
  DeviceArray<float> scales;
  DeviceArray<Q8Run> runs;  // every layer's, relative to its first value and row
  std::vector<Layer> layers;
  std::vector<Part> parts;  // in the values' order
  Q8Weight head;
  Q8Weight embed;  // int8_only: the rows the embedding gathers (tied: the head; untied: its own matrix)
  bool on() const { return head.q != nullptr; }
};

// int8_only: a stretch of host.params the compact copy holds ([begin, end) at params + at); the
// layers' int8 matrices are the gaps between them.
struct KeptRange {
  int64_t begin = 0, end = 0, at = 0;
};

template <typename E>
struct DecoderState {
  OwnedStream stream;  // first: destroyed last
  DecoderSettings settings;
  ModelConfig cfg;
  DeviceInfo info;
  DeviceArray<E> params;                   // (n_params) host.params, rounded to E
  std::string weights_from;                // "bf16" / "int8": an export's matrices, dequantised; "": fp32
  DecoderQ8 q8;                            // an int8 export's matrices as stored (settings.int8_decode)
  DeviceArray<E> q8_scratch;               // int8_only: one layer's matrices dequantised, as its q8 values lie
  DeviceView<E> w;                         // views of params at the host's offsets
  DeviceArray<float> rope_cos, rope_sin;   // (rope_T, hd/2): the CPU's own table
  int64_t rope_T = 0;
  // Per layer: JTok with a scaler not all 0 (the CPU's gated path; a scaler of zeros is the plain
  // model's path, decided once: the decoder's weights are a copy), the layer's index in
  // rows->layers() (-1: no table), its first JTok-M table's index among the layer's tables, and its
  // slot in acts.host_sel (-1: no JTok-M).
  std::vector<uint8_t> jtok_gated;
  std::vector<int64_t> rows_layer, jtokm_first, sel_slot;
  int64_t jtokm_layers = 0;
  RowPath path = RowPath::in_place;
  std::unique_ptr<StepRows<E>> rows;       // null: no layer reads a table
  DecoderKv kv;
  DecoderActs<E> acts;
  Matmul mm;
  // Decode steps as CUDA graphs; null: every step eager, graphs_off says why (settings.cuda_graphs
  // off, staged rows, profiling, or a capture that failed).
  std::unique_ptr<DecodeGraphs> graphs;
  std::string graphs_off;
  std::unique_ptr<DecodeProfiler> prof;  // JTOK_PROFILE=1 (or settings.profile): the steps' events
  StepBreakdown last_step;               // the last decode step's, when profiling
  int64_t last_graph_kernels = 0;        // the last decode step's graph's kernels (0: it ran eagerly)
  int64_t last_graph_pdl_edges = 0;      // and its programmatic edges
  std::string pdl_off;                   // settings.pdl asked but refused by the runtime: why (then none)
  DecoderMemoryPlan plan;                // what the set-up allocates (checked against the free memory first)
  cudaStream_t s() const { return stream.s; }
};

// A step's rows: R of them (ids, row_seq, pos uploaded into acts.step); fresh: a prefill of an empty
// sequence (attention over the rows' own keys and values); max_len: the most positions a row attends
// to (its position + 1); count_rows: keep JTok-M's choices for the rows-read count (decode).
// timed: a profiled decode step (its phases marked on st.prof). digest: a decode step whose head
// is followed by the logit digests of its R rows (inputs in acts.digest_rows).
struct StepShape {
  int64_t R = 0;
  bool fresh = false;
  int64_t max_len = 0;
  bool count_rows = false;
  bool timed = false;
  bool digest = false;
};

// decoder_q8.cu: host's int8 matrices into q8 as decoder_q8_sizes(host.cfg, int8_only) lays them out
// (host an int8 export).
void upload_q8(DecoderQ8& q8, const Model& host, bool int8_only);
// The stretches of host.params (n values) the copy in E holds: all of it, or with int8_only all but
// q8's parts, packed back to back.
std::vector<KeptRange> kept_ranges(const DecoderQ8& q8, bool int8_only, int64_t n);
// int8_only's views: kept stretches into params (laid out by kept), each layer's int8 parts into
// st.q8_scratch as its values lie (all layers the same scratch: a prefill fills it a layer at a time),
// the embedding and LM head null (forward_rows gathers q8.embed's rows, head_forward multiplies q8.head).
template <typename E>
DeviceView<E> int8_only_view(const DecoderState<E>& st, const std::vector<KeptRange>& kept, const Model& host);
// int8_only: layer l's int8 matrices dequantised into st.q8_scratch (a prefill, before the layer).
template <typename E>
void dequantize_layer(DecoderState<E>& st, size_t l);

// decoder_setup.cu: what the decoder does not run (check_device_supported's, settings out of range,
// JTok-M past the kernels' tables, an unknown table_rows), refused by name before anything is made.
void check_decoder_settings(const Model& host, const DecoderSettings& s);
// check_decoder_settings, the memory plan against the GPU's free memory (refused by
// decoder_memory_refusal's message), then everything above.
template <typename E>
void setup_decoder(DecoderState<E>& st, const Model& host, const DecoderSettings& s);
template <typename E>
std::string describe_decoder(const DecoderState<E>& st);

// decoder_forward.cu: tokens (R, host; also in acts.ids) through the embedding and every layer
// (h (R,d) after the last), their keys and values appended to the pages.
template <typename E>
void forward_rows(DecoderState<E>& st, const int32_t* tokens, const StepShape& sh);
// The final norm and LM head of h's rows first..first+n-1 (n <= head_rows) -> acts.logits (n, Vp).
template <typename E>
void head_forward(DecoderState<E>& st, int64_t first, int64_t n);
// acts.logits' first n rows' real columns -> acts.host_logits (n, V), queued (no sync).
template <typename E>
void queue_logits_copy(DecoderState<E>& st, int64_t n);
// head_forward, queue_logits_copy, then the stream's sync: acts.host_logits holds them.
template <typename E>
void head_logits(DecoderState<E>& st, int64_t first, int64_t n);

// decoder_step.cu: a decode step of M sequences (checked by the caller; max_len the longest row's
// positions) padded to its bucket, eager or replayed as its graph -> acts.host_logits (M, V), or with
// rows (M inputs, not null) acts.host_digests (M) and the logits left in acts.logits; and, for
// JTok-M, acts.host_sel's first M rows.
template <typename E>
void decode_step(DecoderState<E>& st, const int64_t* seqs, const int32_t* tokens, int64_t M, int64_t max_len,
                 const DigestRow* rows = nullptr);

}  // namespace jtok::cuda
