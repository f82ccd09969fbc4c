// The GPU decoder's buffer sizes and its plan of GPU memory, from the config and the settings alone.
// A plain C++ header (in jtok_lib in every build): cuda/decoder_setup.cu and cuda/step_rows.cu size
// their allocations from these functions, and decoder_memory_plan sums the same numbers, so the plan
// `jtok serve` / `bench-decode` print and the decoder's own check (free GPU memory, at set-up) are
// the allocations' arithmetic, not a second copy of it.
//   weights          host.params in E (bf16 2 bytes, fp32 4) + the RoPE table (cos, sin: T x hd/2 fp32);
//                    int8_only: less the layers' int8 matrices
//   kv_pages         per layer a K and a V pool of n_pages + 1 (the scratch page) pages of
//                    page_tokens x KV x hd (bf16 or fp32) + the page tables ((max_seqs + 1) x max_pages int32)
//   activations      one step's buffers for R = max(max_batch, max_prefill) rows (cuda/decoder_state.h's
//                    DecoderActs but the three below), JTok-M's and MoE's included
//   attention_scratch  paged_attention's partial softmax states over the whole context for
//                    decoder_attention_scratch's rows (at most ~256 MiB past max_batch's)
//   logits           the LM head's blocks: head_rows x Vp fp32 logits + head_rows x d final norm (E) +
//                    max_batch logit digests and their inputs (cuda/logit_digest.h)
//   row_slots        StepRows' (slots, R, d) rows of E, the ids and their dedup
//   hbm_tables       table_rows "hbm": a device copy of every table (slots x Vp x d of E)
//   int8_weights     an int8 export's matrices that decode steps read as stored (decoder_q8_sizes);
//                    int8_only: + one layer's matrices in E (the prefills' scratch)
// host_pinned (not GPU memory, not in total): the pinned staging of the step's ints, logits, JTok-M
// choices and, staged, the rows (slots, R, d).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda/decoder.h"
#include "model/config.h"
#include "model/moe.h"

namespace jtok::cuda {

// Positions a flash-decoding chunk of paged_attention covers (cuda/paged_kv.h).
constexpr int64_t kPagedAttentionChunk = 256;
// Floats of scratch paged_attention needs for R rows of H heads over at most max_len positions.
int64_t paged_attention_scratch(int64_t R, int64_t H, int64_t hd, int64_t max_len);
// The decoder's paged-attention scratch: room for min(R, max(max_batch, the rows 256 MiB holds))
// rows over the whole context, so a decode step is one launch and a long prefill's rows run in
// groups (paged_attention takes any scratch that holds a row); at least one row.
constexpr int64_t kPagedScratchFloats = int64_t{64} << 20;
int64_t decoder_attention_scratch(int64_t R, int64_t max_batch, int64_t H, int64_t hd, int64_t context);

// The paged KV cache's shape (cuda/decoder_state.h's DecoderKv).
struct DecoderKvSizes {
  int64_t max_pages = 0;  // pages of one sequence of the whole context
  int64_t n_pages = 0;    // pages KvPages hands out (the scratch page is one more)
  int64_t max_seqs = 0;   // sequences open at once (the scratch row is one more)
  int64_t layers = 0, page_elems = 0, elem_bytes = 0;  // page_elems: page_tokens x KV x hd
  int64_t pool_bytes() const { return (n_pages + 1) * page_elems * elem_bytes; }  // one K or V pool
  int64_t table_ints() const { return (max_seqs + 1) * max_pages; }
};
// context: the RoPE table's positions (cfg.max_position_embeddings).
DecoderKvSizes decoder_kv_sizes(const ModelConfig& c, const DecoderSettings& s, int64_t context);

// What kinds of layers the model has: they decide which buffers are sized (0 elements otherwise).
struct DecoderLayerKinds {
  bool dense = false;         // a layer with a dense SwiGLU MLP
  bool moe = false;           // an MoE layer
  bool gated = false;         // a JTok layer whose scaler is not all ones (the gated path)
  int64_t jtokm_layers = 0;   // layers with a JTok-M router
  int64_t table_slots = 0;    // token tables read a step: JTok's one a layer, JTok-M's n_e a layer
  bool int8 = false;          // an int8 export whose decode steps read its int8 matrices (settings.int8_decode)
  bool int8_only = false;     // and holds its layers' matrices in int8 alone (settings.int8_only)
};
// From the config: every JTok layer counted as gated (the set-up reads the scalers: an all-ones
// scaler takes the plain path and drops mlp_out, nrows, inv_norm).
DecoderLayerKinds decoder_layer_kinds(const ModelConfig& c);

// An int8 export's matrices as a decode step reads them (settings.int8_decode; cuda/decoder_state.h's
// DecoderQ8): every layer's q | k | v and o, a dense layer's gate | up and down, an MoE layer's
// experts (routed and shared), and the LM head (Vp, d; the embedding's when tied): `values` int8
// weights, `rows` fp32 scales.
struct DecoderQ8Sizes {
  int64_t values = 0, rows = 0;
  int64_t routed_values = 0, routed_rows = 0;  // MoE's routed experts among them (a step reads the chosen)
  int64_t max_layer_values = 0;                // one layer's most (int8_only's scratch, in the copy's type)
  int64_t bytes() const { return values + 4 * rows; }
};
// embed: an untied embedding's too (int8_only gathers its rows from them; a tied one is the head).
DecoderQ8Sizes decoder_q8_sizes(const ModelConfig& c, bool embed = false);

// The forward arrays of an MoE block over N rows (cuda/model_moe.h's DeviceMoeActs; size_moe_acts).
struct MoeActSizes {
  int64_t probs = 0, topw = 0, frac = 0;                      // fp32
  int64_t topi = 0, offsets = 0, slot_of = 0, row_of = 0;     // int32
  int64_t experts = 0, num_experts = 0;                       // int32
  int64_t aux = 0;                                            // double
  int64_t xg = 0, gu = 0, act = 0, eo = 0, sg = 0, su = 0, sact = 0;  // E
  int64_t bytes(int64_t e_bytes) const;
};
MoeActSizes moe_act_sizes(const MoeDims& m, int64_t N);

// Elements of each of DecoderActs' arrays (cuda/decoder_state.h) for R rows.
struct DecoderActSizes {
  int64_t R = 0, head_rows = 0;
  int64_t h = 0, a = 0, x = 0, q = 0, att = 0, k = 0, v = 0, qkv = 0;  // E
  int64_t gate_up = 0, act = 0, mlp_out = 0, nrows = 0, lnf = 0;                 // E
  int64_t rstd = 0, inv_norm = 0, lse = 0, attn_scratch = 0;                      // fp32
  int64_t m_logits = 0, m_sig = 0, m_w = 0, m_inv_norm = 0, logits = 0;           // fp32
  int64_t m_sel = 0, step = 0, identity = 0, attn_counters = 0;                   // int32
  MoeActSizes moe;            // MoE layers' forward arrays (none without MoE)
  int64_t moe_logits = 0;     // fp32 (R, E); the grouping scratch is cub's (DecoderCubBytes)
  // Host pinned: the step's ints (3 R), the logits' real columns (head_rows, V), JTok-M's choices.
  int64_t host_step = 0, host_logits = 0, host_sel = 0;
  // A decode_digest step's rows (max_batch): DigestRow inputs and LogitDigests, on the device and pinned.
  int64_t digests = 0;
};
DecoderActSizes decoder_act_sizes(const ModelConfig& c, const DecoderSettings& s, const DecoderLayerKinds& k,
                                  int64_t context);
// R of a step's buffers: max(max_batch, max_prefill).
int64_t decoder_max_rows(const DecoderSettings& s);

// StepRows' buffers (cuda/step_rows.h): slots tables of V x d, max_n ids a step.
struct StepRowsSizes {
  int64_t out = 0;      // (slots, max_n, d) of T on the device; staged: the same pinned
  int64_t ids = 0;      // int32 each of ids, unique, inverse, order (max_n)
  int64_t offsets = 0;  // int32 (max_n + 1)
  int64_t table = 0;    // hbm: one table's V x d of T
};
StepRowsSizes step_rows_sizes(int64_t slots, int64_t max_n, int64_t V, int64_t d);

// What only nvcc's code can size (cub's temporary storage inside cuda/dedup.h's dedup_scratch_bytes
// and cuda/moe.h's moe_group_scratch_bytes), in bytes: the set-up passes them; 0 off the GPU (the
// CPU plan; well under a MiB a scratch at the shapes of configs/).
struct DecoderCubBytes {
  int64_t rows_dedup = 0;  // dedup_scratch_bytes(R, Vp), with table rows
  int64_t moe_group = 0;   // moe_group_scratch_bytes of R rows, with MoE layers
};

// Free memory the check leaves unplanned: cudaMalloc's rounding, CUDA graphs, the runtime's own.
constexpr int64_t kDecoderHeadroomBytes = int64_t{256} << 20;

struct DecoderMemoryPlan {
  int64_t weights = 0, kv_pages = 0, activations = 0, attention_scratch = 0, logits = 0, row_slots = 0;
  int64_t hbm_tables = 0, int8_weights = 0;
  int64_t host_pinned = 0;  // not GPU memory
  int64_t total() const {
    return weights + kv_pages + activations + attention_scratch + logits + row_slots + hbm_tables + int8_weights;
  }
  // (name, bytes) of the GPU items, in the order above.
  std::vector<std::pair<std::string, int64_t>> items() const;
};
// staged_rows: the rows go through pinned staging (host_pinned only).
DecoderMemoryPlan decoder_memory_plan(const ModelConfig& c, const DecoderSettings& s, const DecoderLayerKinds& k,
                                      bool hbm_tables, bool staged_rows, const DecoderCubBytes& cub = {});
// From the config alone (decoder_layer_kinds; table_rows "hbm" decides hbm_tables, "staged" the staging);
// int8_export: the model's matrices are an int8 export's (with s.int8_decode: the int8 weights item).
DecoderMemoryPlan decoder_memory_plan(const ModelConfig& c, const DecoderSettings& s, bool int8_export = false);
// One line: "GPU memory plan 6.10 GiB: weights 1.11, KV pages 0.44 (... pages), ..., host pinned 0.01 GiB".
std::string decoder_plan_line(const DecoderMemoryPlan& p);
// "" when total + kDecoderHeadroomBytes fits in free_bytes; else why, naming the three largest items
// with the setting that shrinks each.
std::string decoder_memory_refusal(const DecoderMemoryPlan& p, int64_t free_bytes);

}  // namespace jtok::cuda
