// The Transformer (dense or MoE) on the GPU: a device copy of a CPU jtok::Model (model/transformer.h) in the
// same flat parameter layout, device activations for one (B,T) micro-batch, and the training step's
// forward and backward in the CPU engine's op order (model/layer_block.cpp, model/transformer.cpp):
//   h = E[ids]; per layer: a = RMSNorm(h_in); q | k | v = a [Wq; Wk; Wv]^T (+ b) (one product; with
//   qk_norm the per-head RMSNorm of q and k inside its rows);
//   RoPE; att = causal GQA attention; h_mid = h_in + att Wo^T; m = RMSNorm(h_mid);
//   h_out = h_mid + Delta_m, Delta_m = (silu(m Wg^T) * m Wu^T) Wd^T or MoE(m) (JTok: Delta_m * (1 + s Norm(E[x])));
//   lnf = RMSNorm(h_out); loss = CE(lnf W_head^T)
// The LM head and the cross-entropy run fused over chunks of rows (cuda/cross_entropy.h): the
// trainer's chunks hold at most 1 GiB of logits (lm_head_chunk_rows), never the whole (B T, Vp).
// Gradients accumulate (+=) into one fp32 buffer laid out as the CPU's m.grads (the weight products of
// a step's first backward write theirs over: DeviceModel::grads_fresh). E, the activations'
// and the forward weights' type: float (the checking instantiation: the forward reads the fp32
// master weights) or __nv_bfloat16 (a bf16 copy of the masters, written by the optimizer). JTok
// layers gate the MLP update by their token table (cuda/jtok.h); JTok-M layers route on the
// attention input and inject beside the MLP (cuda/jtokm.h: activations and the tables' forward copy
// in E, router logits, weights, norms and sums in fp32); the tables are held whole on the device
// (fp32 masters, a bf16 copy for the bf16 forward) with dense fp32 gradients and a flag per touched
// row. MoE layers (model/moe.h) replace the dense MLP by the block of cuda/model_moe.h, its aux loss
// in the step's gradient as on the CPU. A frozen backbone (--train-only
// tables) trains only the token-indexed modules, as on the CPU. Not on the GPU: low-precision
// (exported) weights (refused, by name).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "cuda/attention.h"
#include "cuda/dedup.h"
#include "cuda/device_array.h"
#include "cuda/jtokm.h"
#include "cuda/matmul.h"
#include "cuda/model_kernels.h"
#include "cuda/model_moe.h"
#include "cuda/phase_profile.h"
#include "cuda/table_rows.h"
#include "model/transformer.h"

namespace jtok::cuda {

// One layer's tensors inside a device flat buffer (P: the forward's weight type, or float gradients);
// null where the layer has no such tensor (biases without attention_bias, gains without qk_norm).
template <typename P>
struct DeviceLayerView {
  P *ln1 = nullptr, *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr, *ln2 = nullptr;
  P *bq = nullptr, *bk = nullptr, *bv = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  P *wg = nullptr, *wu = nullptr, *wd = nullptr;  // the dense MLP; null on MoE layers
  DeviceMoeView<P> moe;  // MoE layers only (moe.router null elsewhere)
  P* jtok_scale = nullptr;  // (d) JTok layers only
  P *jtokm_router = nullptr, *jtokm_scale = nullptr;  // (n_e, d), (d) JTok-M layers only
};
template <typename P>
struct DeviceView {
  P* embed = nullptr;  // (Vp, d)
  std::vector<DeviceLayerView<P>> layers;
  P* norm = nullptr;     // (d)
  P* lm_head = nullptr;  // (Vp, d); == embed when tied
};

// What the GPU does not run, refused by name before anything is allocated (the GPU model's and the
// GPU decoder's; `who` starts each message): low-precision (exported) weights unless lowp_weights
// (the decoder, which dequantises them at load), head dims other than 32 / 64 / 128, MoE top-K past
// the kernels' bound, token tables that are not whole (Vp, d) tables.
void check_device_supported(const Model& host, const std::string& who, bool lowp_weights);
// hv's pointers (into host.params: host.w, or a view of it) each moved by at(p) (null kept null).
template <typename P, typename At>
DeviceView<P> map_view(const ModelView& hv, At at_nonnull) {
  auto at = [&](const float* p) -> P* { return p ? at_nonnull(p) : nullptr; };
  DeviceView<P> v;
  v.embed = at(hv.embed);
  v.norm = at(hv.norm);
  v.lm_head = at(hv.lm_head);
  for (const LayerView& W : hv.layers) {
    DeviceLayerView<P> d;
    d.ln1 = at(W.ln1), d.wq = at(W.wq), d.wk = at(W.wk), d.wv = at(W.wv), d.wo = at(W.wo), d.ln2 = at(W.ln2);
    d.bq = at(W.bq), d.bk = at(W.bk), d.bv = at(W.bv), d.q_norm = at(W.q_norm), d.k_norm = at(W.k_norm);
    d.wg = at(W.wg), d.wu = at(W.wu), d.wd = at(W.wd), d.jtok_scale = at(W.jtok_scale);
    d.jtokm_router = at(W.jtokm_router), d.jtokm_scale = at(W.jtokm_scale);
    d.moe = {at(W.moe.router), at(W.moe.sg), at(W.moe.su), at(W.moe.sd), at(W.moe.experts)};
    v.layers.push_back(d);
  }
  return v;
}
// The device view of a flat buffer at base laid out as host.params: hv's pointers (into
// host.params: host.w, or model/trainable.h's trainable_view of it) moved to base (base + (host
// pointer - host.params.data()), null kept). P: float or __nv_bfloat16.
template <typename P>
DeviceView<P> device_view(P* base, const Model& host, const ModelView& hv);
template <typename P>
DeviceView<P> device_view(P* base, const Model& host) {
  return device_view(base, host, host.w);
}

// The MLP update's buffers for N rows: gate (N,2F) holds gate | up (one product), act (N,F) (dense
// layers); the MoE block's activations and scratch (MoE layers).
template <typename E>
struct MlpBuffers {
  E *gate = nullptr, *act = nullptr;
  DeviceMoeActs<E>* moe = nullptr;
  DeviceMoeScratch<E>* moe_scratch = nullptr;
  const MoeQ8* moe_q8 = nullptr;  // the GPU decoder's int8 experts (a decode step of an int8 export)
};
// x (N,d) -> out (N,d) = residual + Delta_m (residual null: Delta_m alone; it may be out itself),
// Delta_m = down(silu(x Wg^T) * x Wu^T) (the down product reads residual: linear_forward_residual),
// or the MoE block's output (the block adds onto out: residual copied there first, or zeros). The
// training forward's and the decoder's MoE layers' (cuda/decoder_forward.cu).
template <typename E>
void mlp_update(Matmul& mm, const ModelConfig& c, const DeviceLayerView<E>& W, const MlpBuffers<E>& b, const E* x,
                E* out, const E* residual, int64_t N, cudaStream_t s);

// Whether layer W's q, k, v weights (and biases) lie back to back in the flat parameters, so that
// [Wq; Wk; Wv] is one (qd + 2 kvd, d) weight (model/transformer.cpp's layout puts them so).
template <typename P>
bool qkv_back_to_back(const DeviceLayerView<P>& W, const ModelConfig& c) {
  const int64_t d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim();
  return W.wk == W.wq + qd * d && W.wv == W.wk + kvd * d && (!W.bq || (W.bk == W.bq + qd && W.bv == W.bk + kvd));
}

// Whether layer W's gate and up weights lie back to back ([Wg; Wu] one (2F, d) weight), or W is an
// MoE layer (no dense MLP).
template <typename P>
bool gate_up_back_to_back(const DeviceLayerView<P>& W, const ModelConfig& c) {
  return W.moe.router || W.wu == W.wg + c.intermediate_size * c.hidden_size;
}

// Refuses (`who` first) a layer whose q, k, v or gate, up weights do not lie back to back: the
// training step and the decoder read each group as one weight.
template <typename P>
void require_fused_layout(const DeviceView<P>& w, const ModelConfig& c, const std::string& who) {
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const bool qkv = qkv_back_to_back(w.layers[l], c), gate_up = gate_up_back_to_back(w.layers[l], c);
    JTOK_CHECK(qkv && gate_up, who, ": layer ", l, "'s ", qkv ? "gate and up" : "q, k and v",
               " weights do not lie back to back in the parameters (the fused products read them as one)");
  }
}

// q, k and v (or their gradients) as the attention and RoPE read them: inside (N, qd + 2 kvd) rows
// of one q | k | v product, row stride W = qd + 2 kvd.
template <typename E>
struct QkvView {
  E *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t stride = 0;  // W
  AttnStrides attn;    // {W, W}
};
// q, k at rows' columns [0, qd), [qd, qd + kvd), v at v_rows' [qd + kvd, W): a layer's activations
// (rows L.q; v_rows L.q_in with qk_norm, whose norm writes only q and k into L.q, else L.q) or their
// gradients (a.dq both).
template <typename E>
QkvView<E> qkv_view(const ModelConfig& c, E* rows, E* v_rows) {
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), W = qd + 2 * kvd;
  return {rows, rows + qd, v_rows + qd + kvd, W, {W, W}};
}

template <typename E>
struct DeviceModel {
  // Copies host's parameters (and its RoPE table) to the device; gradients zeroed. Refuses what is
  // not on the GPU yet, naming it.
  explicit DeviceModel(const Model& host, cudaStream_t stream = nullptr);

  ModelConfig cfg;
  std::vector<ParamInfo> layout;  // host's: names, shapes, offsets into master / grads
  // Per layout entry: whether it trains (model/trainable.h; a frozen backbone's tensors do not: their
  // pointers in g are null, so the backward makes no weight-gradient product for them and their
  // gradients stay zero; the optimizer skips them).
  std::vector<uint8_t> trainable;
  int64_t n_params = 0;
  DeviceArray<float> master;      // (n_params) fp32 parameters, m.params' layout
  DeviceArray<E> copy;            // (n_params) E = bf16 only: the forward's weights (empty for fp32)
  DeviceArray<float> grads;       // (n_params) fp32, m.grads' layout
  // Where a step's gradients start (plan_grad_spans): the products' weights (every layer's q | k | v
  // and o, the dense layers' gate | up and down, the untied LM head) are written over by the step's first backward
  // (grads_fresh: beta 0, no zeroing first, no zeros read back); zero_grads clears the other trainable
  // tensors (zeroed_grads, one launch) and sets grads_fresh, the backward clears it. A frozen
  // tensor's gradient is zeroed at set-up and never written.
  std::vector<Span> product_grads;
  DeviceSpans zeroed_grads;
  bool grads_fresh = true;
  DeviceArray<float> rope_cos, rope_sin;  // (rope_T, hd/2): the CPU's own table
  int64_t rope_T = 0;
  // The token tables, one (Vp, d) block each in host.tables' order (a JTok-M layer's n_e
  // consecutive: cuda/jtokm.h's E (n_e, V, d)), with dense fp32 gradients and touched flags.
  std::vector<int> jtok_table;    // per layer: its JTok table (an index into the tables), or -1
  std::vector<int> jtokm_table;   // per layer: the first of its n_e JTok-M tables, or -1
  int64_t n_tables = 0, table_numel = 0;  // table_numel = Vp d
  DeviceArray<float> tables;        // (n_tables, Vp, d) fp32
  DeviceArray<E> table_copy;        // E = bf16 only: the forward's copy
  // Dense in memory, zeroed once at set-up; a row holds this step's gradient only where its flag is
  // set, stale values elsewhere: the backward writes a row's first gradient of a step over it and
  // adds later ones (jtok.h), and sets its flag; the table AdamW clears the flags it used, zeroing
  // their rows only where the backward adds by atomics (DeviceAdamW::zero_table_grad_rows);
  // zero_grads clears flags and rows.
  DeviceArray<float> table_grads;   // (n_tables, Vp, d)
  // Its flags, listed (global row k Vp + r) for the per-step passes (norm, table AdamW, clearing):
  // `flagged` until a table AdamW step has cleared every flag it listed (zero_grads then skips its pass).
  RowFlags table_flags;  // (n_tables Vp)
  // The token embedding's gradient kept row-sparse where it may be (trainable, untied: embed_rows_on),
  // so the optimizer can step it as a table (cuda/model_optimizer.h's defer_embedding): zero outside
  // the flagged rows, the backward adding into the rows of the batch's ids and flagging them, and the
  // flagged rows cleared by the optimizer's step or zero_grads (never a memset of the (Vp, d) span).
  RowFlags embed_flags;           // (Vp), or empty: the span is zeroed whole
  DeviceView<E> w;                // views of the forward's weights
  DeviceView<float> g;            // views of grads
  Matmul mm;                      // cuBLASLt plans; one stream at a time
  cudaStream_t stream;
  PhaseProfile* profile = nullptr;  // while profiling: the step's phases marked on stream
  // bf16: the attention kernels' query rows a warp (cuda/attention_rows.h), timed on layer 0 at the first
  // forward (pick_attention_rows) unless set before it; the same bits either way. fp32: unused (16).
  AttentionRows attn_rows;

  // Whether layer l reads token tables (JTok's gate or JTok-M's injection).
  bool has_tables(size_t l) const { return jtok_table[l] >= 0 || jtokm_table[l] >= 0; }

  E* weights() const {
    if constexpr (std::is_same_v<E, float>) return master.get();
    else return copy.get();
  }
  void upload_tables(const Model& host);  // the constructor's: tables, copies, gradients, flags
  const E* table(int64_t k) const {
    if constexpr (std::is_same_v<E, float>) return tables.get() + k * table_numel;
    else return table_copy.get() + k * table_numel;
  }
  float* table_grad(int64_t k) const { return table_grads.get() + k * table_numel; }
  bool embed_rows_on() const { return embed_flags.size() > 0; }
  int64_t embed_offset() const { return g.embed ? g.embed - grads.get() : -1; }  // in master, grads, moments
  uint8_t* touched(int64_t k) const { return table_flags.flags.get() + k * cfg.padded_vocab(); }
};

// Called for a layer's tables [table, table + tables) and their rows of the micro-batch before the
// layer reads them (rb: its deduplicated ids; of them table j's entries in `subset`, bit subset.bit +
// j): the table optimizer brings those rows current (cuda/model_optimizer.h's table_row_sync, one
// launch). JTok's, all of rb, right after the dedup; JTok-M's n_e, the (id, table) pairs its layer's
// routing chose, right after the routing. Empty: nothing deferred.
using DeviceRowSync =
    std::function<void(int64_t table, int64_t tables, const DeviceRowBatch& rb, int64_t N, RowSubset subset)>;
// Called with the micro-batch's deduplicated ids before the embedding reads their rows: the
// optimizer brings them current (cuda/model_optimizer.h's embedding_row_sync). Empty: nothing deferred.
using DeviceEmbedSync = std::function<void(const DeviceRowBatch& rb, int64_t N)>;
// Called before a layer reads table `table`'s rows: the stream waits for work on another stream that
// writes them (cuda/table_streams.h). Empty: all on one stream.
using DeviceRowWait = std::function<void(int64_t table)>;

// One layer's saved activations (N = B*T rows).
template <typename E>
struct DeviceLayerActs {
  // q (N, qd + 2 kvd): q | k | v (qkv_view); gate (N,2F): gate | up.
  DeviceArray<E> h_in, a, q, att, h_mid, m, gate, act;  // (N,d) (N,d) q (N,qd) (N,d)x2 gate (N,F)
  DeviceArray<E> q_in;                                  // qk_norm: the product's q | k | v, q and k before their norm
  DeviceArray<float> rstd1, rstd2, lse;       // (N), (N), (B,H,T)
  DeviceArray<float> rstd_q, rstd_k;          // qk_norm: (N*H), (N*KV)
  DeviceArray<E> mlp_out, nrows;              // JTok: the ungated MLP update (N,d); normed rows (N bound, d)
  DeviceArray<float> inv_norm;                // JTok: (N bound)
  DeviceMoeActs<E> moe;                       // MoE layers: routing, experts' activations (gate, up, act empty)
  // JTok-M (fp32 in both instantiations): router logits and cuda/jtokm.h's JTokMDeviceActs arrays.
  DeviceArray<float> m_logits, m_sig, m_w, m_inv_norm;  // (N,n_e) (N,n_e) (N,K) (N)
  DeviceArray<int32_t> m_sel, m_load;         // (N,K), (n_e)
  DeviceArray<uint32_t> m_chosen;             // (N bound, U used) the tables each unique id's positions chose
  DeviceArray<double> m_prob_sum, m_wsum;     // (n_e), (n_e) the weights of the positions choosing each
  JTokMDeviceActs jtokm() const {
    return {m_sig.get(), m_sel.get(), m_w.get(), m_inv_norm.get(), m_load.get(), m_prob_sum.get(), m_wsum.get()};
  }
};

// Layer L's q, k, v as the attention reads them (qkv_view: v in q_in's rows with qk_norm).
template <typename E>
QkvView<E> layer_qkv(const ModelConfig& c, const DeviceLayerActs<E>& L) {
  return qkv_view(c, L.q.get(), c.qk_norm ? L.q_in.get() : L.q.get());
}

// Where queue_forward_stats's copies land in pinned memory (read_forward_stats reads them).
struct QueuedForwardStats {
  bool on = false;                      // queued, not read yet
  const double* hidden_sums = nullptr;  // (2 L) each layer's output sum and sum of squares; null: not asked
  std::vector<const double*> moe_aux;   // a MoE layer's aux loss each, in layer order
  struct Routing {
    const int32_t* load;
    const double *weight_sum, *prob_sum;  // (n_e) each
  };
  std::vector<Routing> jtokm;  // a JTok-M layer's each, in layer order
};

// Activations and backward scratch of one (B,T) micro-batch.
template <typename E>
struct DeviceActs {
  int64_t B = 0, T = 0, chunk_rows = 0;
  // The LM head's rows a chunk at most (0: all N): forward sizes chunk_rows = min(N, this), so the
  // (N, Vp) logits exist whole only when asked (lm_head_chunk_rows is the trainer's choice).
  int64_t max_chunk_rows = 0;
  std::vector<DeviceLayerActs<E>> layers;
  DeviceArray<E> h_out, lnf, logits_chunk;    // (N,d), (N,d), (chunk_rows, Vp)
  DeviceArray<float> rstdf, losses;           // (N), (N)
  DeviceArray<double> loss_sum;               // (1)
  mutable HostReadback readback;              // the loss, aux losses and telemetry read back (pinned)
  DeviceArray<int32_t> ids, targets;          // (N)
  // Backward scratch.
  // dq as the layer's q (all three), dgate as gate (both).
  DeviceArray<E> dh, dx, dq, datt, dgate, dact;
  DeviceArray<E> dmlp;                        // JTok: (N,d) the gated update's gradient
  DeviceArray<float> row_terms, norm_scratch; // (B,H,T); rmsnorm_backward's per-block partials
  DeviceMoeScratch<E> moe;                    // MoE layers: logits, grouping and backward scratch
  DeviceArray<float> jtok_scratch;            // JTok: ds's per-id partials
  DeviceArray<float> m_de, m_scratch;         // JTok-M: dL/de (N,d) fp32, ds's partials
  DeviceArray<float> m_hot, embed_hot;        // the hot ids' pieces (cuda/hot_ids.cuh): JTok-M's, the embedding's
  DeviceArray<double> stats;                  // telemetry: sum_and_squares' scratch and each layer's two sums
  HostReadback stats_readback;                // the forward's values the host reads (queue_forward_stats)
  QueuedForwardStats queued;                  // where they land, valid once the stream is waited for
  DeviceArray<E> m_dg;                        // JTok-M: dL/dg (N,n_e), the router products' operand
  // The micro-batch's ids deduplicated by the forward (cuda/dedup.h): JTok's gathers, the
  // embedding's and the tables' row gradients.
  DeviceArray<int32_t> unique, inverse, offsets, order, num_unique;
  DeviceArray<uint8_t> dedup_scratch;
  int64_t distinct_ids = 0;      // U, counted on the host by forward (cuda/dedup.h's max_unique)
  std::vector<uint8_t> id_seen;  // (Vp) the count's marks, all zero between forwards
  DeviceRowSync row_sync;  // if set, called for each table before its layer (row_batch)
  DeviceEmbedSync embed_sync;  // if set, called before the embedding's gather (row_batch)
  DeviceRowWait row_wait;  // if set, called before a layer reads a table
  DeviceRowBatch row_batch() const {
    return {unique.get(), inverse.get(), offsets.get(), order.get(), num_unique.get(), true, distinct_ids};
  }
  // false (training's table_dedup false, the naive cost): JTok's and JTok-M's table rows gathered and
  // their gradients scattered a token position at a time (cuda/dedup.h's identity_batch; fp32 atomics
  // into the row gradients: not bitwise reproducible). The token embedding's backward and the table
  // optimizer's row syncs keep the deduplicated batch (distinct rows), so the touched rows are the same.
  bool table_dedup = true;
  DeviceArray<int32_t> positions, position_count;  // (N+1), (1): the identity batch, filled by forward
  // The batch JTok's and JTok-M's gathers and row gradients walk.
  DeviceRowBatch table_batch() const {
    if (table_dedup) return row_batch();
    return identity_batch(ids.get(), positions.get(), position_count.get());
  }
};

// Rows of an LM-head chunk whose (rows, Vp) logits of elem_bytes each take at most 1 GiB, a multiple
// of 128 (at least 128): at Vp 50,304 in bf16 10,624 rows, at 151,936 3,456. Each chunk adds its part
// of the head's weight gradient into the fp32 (Vp, d) whole, read and written again a chunk (at config
// b 2 x 154.5 MB): at 16 x 1024 tokens 2 chunks, 0.6 GB a step, where 256 MiB chunks (7) would move 2.2 GB.
int64_t lm_head_chunk_rows(int64_t Vp, int64_t elem_bytes);
// Sizes acts for (B,T) (a no-op when already so); chunk_rows: the LM head's rows a chunk (0: all N).
template <typename E>
void ensure_device_activations(DeviceActs<E>& acts, const DeviceModel<E>& dm, int64_t B, int64_t T,
                               int64_t chunk_rows = 0);

// ids (B,T) on the host (checked against the vocabulary) -> acts.lnf, every layer's activations kept.
template <typename E>
void forward(DeviceModel<E>& dm, DeviceActs<E>& acts, const int32_t* ids, int64_t B, int64_t T);
// The mean cross-entropy of the last forward against targets (B,T), no gradient (evaluation).
template <typename E>
double forward_loss(DeviceModel<E>& dm, DeviceActs<E>& acts, const int32_t* targets);
// After forward: the mean loss, and grad_scale * d(mean loss) accumulated into dm.grads (as the CPU's
// backward; the LM head's weight gradient chunk by chunk). Returns the mean loss (one sync).
template <typename E>
double backward(DeviceModel<E>& dm, DeviceActs<E>& acts, const int32_t* targets, float grad_scale = 1.0f);

// The flat gradients zeroed (a memset) and the tables' flagged rows with their flags (RowFlags::clear:
// the touched rows' bytes, not the tables'), unless a table step has cleared them since the last
// backward (table_flags.flagged); the row-sparse embedding's flagged rows likewise (embed_flags).
// After a refused step (a non-finite norm: optimizer_step throws before clearing anything) this is
// what cleans the rows it left.
template <typename E>
void zero_grads(DeviceModel<E>& dm);
// The flat buffers back on the host (m.params' / m.grads' layout), after the queued work.
template <typename E>
std::vector<float> download_params(const DeviceModel<E>& dm);
template <typename E>
std::vector<float> download_grads(const DeviceModel<E>& dm);
// Table k's dense gradient (Vp, d): the flagged rows', zeros elsewhere; and its touched flags (Vp).
template <typename E>
std::vector<float> download_table_grad(const DeviceModel<E>& dm, int64_t k);
template <typename E>
std::vector<uint8_t> download_table_touched(const DeviceModel<E>& dm, int64_t k);
// Table k's values (Vp, d) fp32 (current only after sync_tables when the optimizer defers rows).
template <typename E>
std::vector<float> download_table(const DeviceModel<E>& dm, int64_t k);
// After forward, the values of the micro-batch the host reads, read back with no sync of their own:
// each MoE layer's aux loss; each JTok-M layer's routing sums; with hidden_std, each layer's output
// sums. queue_forward_stats queues their copies into pinned memory ahead of the backward (which
// overwrites none of them before: stream order), so the backward's loss read is their sync;
// read_forward_stats takes them then (stream_waited: the caller has waited for the stream since;
// else it waits itself).
//   moe_aux: the MoE layers' aux losses' mean (coef included; 0 without MoE), the CPU's
//     Activations::moe_aux_loss.
//   routing: per JTok-M layer in layer order, per table, the positions that chose it and the sum of
//     their mixing weights (model/jtokm.h's load and weight_sum), and the layers' aux loss, their
//     mean (each model/jtokm.h's jtokm_aux_loss of its P and n, lambda included; 0 without JTok-M),
//     the CPU's Activations::jtokm_aux_loss.
//   hidden_std: the standard deviation of each layer's output (the next layer's h_in, the last one's
//     h_out) over positions and dimensions, averaged over layers (train/telemetry.h's
//     hidden_state_std); 0 when not asked.
struct JTokMRouting {
  std::vector<std::vector<double>> load, weight_sum;
  double aux = 0;
};
struct ForwardStats {
  double moe_aux = 0, hidden_std = 0;
  JTokMRouting routing;
};
template <typename E>
void queue_forward_stats(const DeviceModel<E>& dm, DeviceActs<E>& acts, bool hidden_std);
template <typename E>
ForwardStats read_forward_stats(const DeviceModel<E>& dm, DeviceActs<E>& acts, bool stream_waited);
// Each alone, queued and read at once (one sync; the checks').
template <typename E>
double moe_aux_loss(const DeviceModel<E>& dm, DeviceActs<E>& acts);
template <typename E>
JTokMRouting jtokm_routing(const DeviceModel<E>& dm, DeviceActs<E>& acts);
// The JTok-M dimensions of dm's layers for N rows (model/jtokm.h's jtokm_hyper).
JTokMDims jtokm_dims(const ModelConfig& c, int64_t N);

}  // namespace jtok::cuda
