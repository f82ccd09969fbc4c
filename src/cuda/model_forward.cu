// The device model's forward (src/cuda/model.h), model/layer_block.cpp's steps in its order: the
// ids' dedup (JTok's gathers, the row gradients), the embedding gather, per layer the attention half
// and the MLP half (or the MoE block; JTok's gate, JTok-M's routing and injection where on), the
// final norm; and the loss of the LM head over chunks of rows (evaluation: no gradient).
#include <algorithm>

#include "cuda/attention.h"
#include "cuda/cross_entropy.h"
#include "cuda/dedup.h"
#include "cuda/embedding.h"
#include "cuda/jtok.h"
#include "cuda/jtokm.h"
#include "cuda/model.h"
#include "cuda/model_kernels.h"
#include "cuda/rmsnorm.h"
#include "cuda/rope.h"
#include "cuda/swiglu.h"

namespace jtok::cuda {

namespace {

// JTok-M's routing of layer l on its attention input a: logits (N, n_e) fp32 = a R^T (E operands,
// fp32 out), then top-K (with the (id, table) rows it chose where rows are synced); then those rows
// brought current by a.row_sync (the CPU's
// gather syncs these alone: a row not chosen is left behind until a batch chooses it), while the
// rest of the layer runs if the syncs are on a side stream. Profiled as "table row sync".
template <typename E>
void jtokm_route_layer(DeviceModel<E>& dm, DeviceActs<E>& a, size_t l) {
  DeviceLayerActs<E>& L = a.layers[l];
  const int64_t N = a.B * a.T;
  const JTokMDims dims = jtokm_dims(dm.cfg, N);
  linear_forward<E, float>(dm.mm, L.m_logits.get(), L.a.get(), dm.w.layers[l].jtokm_router, nullptr, N, dims.d,
                           dims.n_e, false, dm.stream);
  const ChosenTables chosen{a.row_sync ? L.m_chosen.get() : nullptr, a.row_batch()};
  jtokm_route(L.jtokm(), L.m_logits.get(), dims, dm.stream, chosen);
  jtokm_route_stats(L.jtokm(), dims, dm.stream);
  if (!a.row_sync) return;
  mark_phase(dm.profile, "attention", dm.stream);
  a.row_sync(dm.jtokm_table[l], dims.n_e, a.row_batch(), N, RowSubset{L.m_chosen.get(), 0});
  mark_phase(dm.profile, "table row sync", dm.stream);
}

// JTok-M's injection of layer l: h_next += c * s * Norm(sum_k w_k E_{sel_k}[x]) (the tables' forward
// copy: dm.table).
template <typename E>
void jtokm_inject_layer(DeviceModel<E>& dm, DeviceActs<E>& a, size_t l, E* h_next) {
  if (a.row_wait)
    for (int64_t i = 0; i < dm.cfg.jtokm_n_e; ++i) a.row_wait(dm.jtokm_table[l] + i);
  jtokm_mix_inject(h_next, a.layers[l].jtokm(), a.ids.get(), dm.table(dm.jtokm_table[l]), dm.w.layers[l].jtokm_scale,
                   jtokm_dims(dm.cfg, a.B * a.T), dm.stream);
}

// bf16: the attention kernels' rows a warp timed on layer l's buffers (the backward's too: their values
// are not kept, and dout is zeroed first so the backward reads no stale bits) before any holds a value.
template <typename E>
void time_attention_rows(DeviceModel<E>& dm, DeviceActs<E>& a, DeviceLayerActs<E>& L, const QkvView<E>& v) {
  const auto& c = dm.cfg;
  const QkvView<E> dg = qkv_view(c, a.dq.get(), a.dq.get());
  JTOK_CUDA_CHECK(cudaMemsetAsync(a.datt.get(), 0, a.datt.size() * sizeof(E), dm.stream));
  dm.attn_rows = pick_attention_rows(L.att.get(), L.lse.get(), dg.q, dg.k, dg.v, a.row_terms.get(), a.datt.get(), v.q,
                                     v.k, v.v, a.B, a.T, c.num_attention_heads, c.num_key_value_heads, c.hd(),
                                     dm.stream, v.attn, RopeTables{dm.rope_cos.get(), dm.rope_sin.get()});
}

// The attention forward at dm.attn_rows.fwd rows a warp, chosen by time at bf16's first forward.
template <typename E>
void attention_forward_rows(DeviceModel<E>& dm, DeviceActs<E>& a, DeviceLayerActs<E>& L, const QkvView<E>& v) {
  const auto& c = dm.cfg;
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, hd = c.hd();
  if constexpr (std::is_same_v<E, __nv_bfloat16>) {
    if (dm.attn_rows.fwd == 0) time_attention_rows(dm, a, L, v);
    if (dm.attn_rows.fwd == 32)
      return attention_forward_wide(L.att.get(), L.lse.get(), v.q, v.k, v.v, a.B, a.T, H, KV, hd, dm.stream, v.attn);
  }
  attention_forward(L.att.get(), L.lse.get(), v.q, v.k, v.v, a.B, a.T, H, KV, hd, dm.stream, v.attn);
}

// h_in -> h_mid: the input norm, JTok-M's routing (it reads the attention input), q | k | v in one
// product (+ biases; qk_norm: the product lands in q_in and the per-head norms of its q and k in q's
// rows, v read from q_in), RoPE at 0..T-1 on q's and k's H + KV heads (one launch: k's follow q's in
// the row), attention, h_mid = h_in + att Wo^T.
template <typename E>
void attention_half(DeviceModel<E>& dm, DeviceActs<E>& a, size_t l) {
  const auto& c = dm.cfg;
  const auto& W = dm.w.layers[l];
  DeviceLayerActs<E>& L = a.layers[l];
  const int64_t B = a.B, T = a.T, N = B * T, d = c.hidden_size, qd = c.q_dim();
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, hd = c.hd();
  const float eps = static_cast<float>(c.rms_norm_eps);
  cudaStream_t s = dm.stream;
  rmsnorm_forward(L.a.get(), L.rstd1.get(), L.h_in.get(), W.ln1, N, d, eps, s);
  if (W.jtokm_router) jtokm_route_layer(dm, a, l);  // route now, mix at the write-back
  E* product = c.qk_norm ? L.q_in.get() : L.q.get();
  const QkvView<E> v = layer_qkv(c, L);                                                   // v.v in product's rows
  linear_forward<E, E>(dm.mm, product, L.a.get(), W.wq, W.bq, N, d, v.stride, false, s);  // [Wq; Wk; Wv]
  if (c.qk_norm) {  // model/qkv_variants.cpp: after the biases, before RoPE
    rmsnorm_forward(v.q, L.rstd_q.get(), product, W.q_norm, N * H, hd, eps, s, {H, v.stride});
    rmsnorm_forward(v.k, L.rstd_k.get(), product + qd, W.k_norm, N * KV, hd, eps, s, {KV, v.stride});
  }
  rope_forward(v.q, dm.rope_cos.get(), dm.rope_sin.get(), B, T, H + KV, hd, v.stride, 0, s);
  attention_forward_rows(dm, a, L, v);
  linear_forward_residual<E, E>(dm.mm, L.h_mid.get(), L.h_in.get(), L.att.get(), W.wo, nullptr, N, qd, d, s);
}

// JTok's gate: h_next = h_mid + Delta_m * (1 + s * Norm(E[x])) from Delta_m in mlp_out (layer l).
template <typename E>
void jtok_gate(DeviceModel<E>& dm, DeviceActs<E>& a, size_t l, E* h_next) {
  const auto& c = dm.cfg;
  auto& L = a.layers[l];
  const int64_t N = a.B * a.T, d = c.hidden_size;
  const DeviceRowBatch rb = a.table_batch();  // without dedup: a row a position
  if (a.row_wait) a.row_wait(dm.jtok_table[l]);
  jtok_prepare(L.nrows.get(), L.inv_norm.get(), dm.table(dm.jtok_table[l]), rb, N, d, static_cast<float>(c.jtok_eps),
               c.jtok_norm, dm.stream);
  jtok_forward(h_next, L.h_mid.get(), L.mlp_out.get(), dm.w.layers[l].jtok_scale, L.nrows.get(), rb, N, d, dm.stream);
}

// out (N,d) = residual (null: none) + Delta_m of layer l's m: down(silu(m Wg^T) * m Wu^T), or the
// MoE block's output (cuda/model_moe.h).
template <typename E>
void mlp_update_layer(DeviceModel<E>& dm, DeviceActs<E>& a, size_t l, E* out, const E* residual) {
  auto& L = a.layers[l];
  const MlpBuffers<E> b{L.gate.get(), L.act.get(), &L.moe, &a.moe};
  mlp_update(dm.mm, dm.cfg, dm.w.layers[l], b, L.m.get(), out, residual, a.B * a.T, dm.stream);
}

// h_mid -> h_next = h_mid + Delta_m, m = RMSNorm(h_mid); on a JTok layer Delta_m is gated (kept
// apart for the backward: model/layer_block.cpp's gated path; a scaler of zeros takes it too, p = 1
// exactly); JTok-M's injection last.
template <typename E>
void mlp_half(DeviceModel<E>& dm, DeviceActs<E>& a, size_t l, E* h_next) {
  const auto& c = dm.cfg;
  const auto& W = dm.w.layers[l];
  auto& L = a.layers[l];
  const int64_t N = a.B * a.T, d = c.hidden_size;
  cudaStream_t s = dm.stream;
  rmsnorm_forward(L.m.get(), L.rstd2.get(), L.h_mid.get(), W.ln2, N, d, static_cast<float>(c.rms_norm_eps), s);
  if (W.jtok_scale) {
    mlp_update_layer<E>(dm, a, l, L.mlp_out.get(), nullptr);
    jtok_gate(dm, a, l, h_next);
  } else {
    mlp_update_layer(dm, a, l, h_next, L.h_mid.get());  // h_next = h_mid + Delta_m
  }
  if (W.jtokm_router) jtokm_inject_layer(dm, a, l, h_next);
}

// JTok's rows of the batch's distinct ids (as with dedup) brought current by a.row_sync, layer by
// layer, as soon as the ids are known: a table's rows depend on the ids alone, so a side stream may
// run this under the backbone (a.row_wait then holds each gather until its table's rows are done).
// JTok-M's wait for their layer's routing (jtokm_route_layer). True if any was queued.
template <typename E>
bool sync_batch_rows(DeviceModel<E>& dm, DeviceActs<E>& a) {
  bool any = false;
  for (size_t l = 0; a.row_sync && l < a.layers.size(); ++l) {
    if (dm.jtok_table[l] < 0) continue;
    a.row_sync(dm.jtok_table[l], 1, a.row_batch(), a.B * a.T, RowSubset{});
    any = true;
  }
  return any;
}

// The batch's distinct ids, counted on the host as they go up (marks in a.id_seen, cleared again): the
// grids of the kernels of a block an entry (cuda/dedup.h's max_unique), exact.
template <typename E>
int64_t count_distinct(DeviceActs<E>& a, const int32_t* ids, int64_t N, int64_t V) {
  if (static_cast<int64_t>(a.id_seen.size()) < V) a.id_seen.resize(static_cast<size_t>(V));  // new marks zero
  int64_t U = 0;
  for (int64_t n = 0; n < N; ++n) {
    U += a.id_seen[ids[n]] == 0;
    a.id_seen[ids[n]] = 1;
  }
  for (int64_t n = 0; n < N; ++n) a.id_seen[ids[n]] = 0;
  return U;
}

}  // namespace

template <typename E>
void mlp_update(Matmul& mm, const ModelConfig& c, const DeviceLayerView<E>& W, const MlpBuffers<E>& b, const E* x,
                E* out, const E* residual, int64_t N, cudaStream_t s) {
  const int64_t d = c.hidden_size, F = c.intermediate_size;
  if (W.moe.router) {  // the block adds onto out
    const size_t bytes = static_cast<size_t>(N * d) * sizeof(E);
    if (!residual) JTOK_CUDA_CHECK(cudaMemsetAsync(out, 0, bytes, s));
    else if (residual != out) JTOK_CUDA_CHECK(cudaMemcpyAsync(out, residual, bytes, cudaMemcpyDeviceToDevice, s));
    moe_block_forward(mm, out, *b.moe, *b.moe_scratch, x, W.moe, moe_dims(c), N, s, b.moe_q8);
    return;
  }
  linear_forward<E, E>(mm, b.gate, x, W.wg, nullptr, N, d, 2 * F, false, s);  // [Wg; Wu]: gate | up rows (N, 2F)
  swiglu_forward(b.act, b.gate, b.gate + F, N, F, 2 * F, s);
  if (residual) linear_forward_residual<E, E>(mm, out, residual, b.act, W.wd, nullptr, N, F, d, s);
  else linear_forward<E, E>(mm, out, b.act, W.wd, nullptr, N, F, d, false, s);
}

template <typename E>
void forward(DeviceModel<E>& dm, DeviceActs<E>& a, const int32_t* ids, int64_t B, int64_t T) {
  const auto& c = dm.cfg;
  const int64_t N = B * T, d = c.hidden_size;
  if (T > dm.rope_T) fail("cuda model: sequence length ", T, " > the RoPE table's ", dm.rope_T, " positions");
  check_ids(ids, N, c.vocab_size, "token");
  ensure_device_activations(a, dm, B, T, a.max_chunk_rows);
  cudaStream_t s = dm.stream;
  if (dm.profile) dm.profile->begin(s);
  JTOK_CUDA_CHECK(cudaMemcpyAsync(a.ids.get(), ids, a.ids.bytes(), cudaMemcpyHostToDevice, s));
  a.distinct_ids = count_distinct(a, ids, N, c.padded_vocab());
  dedup_ids(a.row_batch(), a.ids.get(), N, c.padded_vocab(), a.dedup_scratch.get(), a.dedup_scratch.bytes(), s);
  if (!a.table_dedup) fill_positions(a.positions.get(), a.position_count.get(), N, s);  // table_batch's
  if (sync_batch_rows(dm, a)) mark_phase(dm.profile, "table row sync", s);  // the ids' copy and dedup with it
  if (a.embed_sync) a.embed_sync(a.row_batch(), N);  // the rows it reads brought current (a deferred optimizer)
  embedding_forward(a.layers[0].h_in.get(), a.ids.get(), dm.w.embed, N, d, s);
  mark_phase(dm.profile, "embedding", s);  // with the ids' copy and dedup (unless timed with the row syncs)
  for (size_t l = 0; l < a.layers.size(); ++l) {
    E* h_next = l + 1 < a.layers.size() ? a.layers[l + 1].h_in.get() : a.h_out.get();
    attention_half(dm, a, l);
    mark_phase(dm.profile, "attention", s);  // norm, JTok-M's routing, q k v, RoPE, attention, o
    mlp_half(dm, a, l, h_next);
    mark_phase(dm.profile, dm.has_tables(l) ? "mlp + tables" : "mlp", s);
  }
  rmsnorm_forward(a.lnf.get(), a.rstdf.get(), a.h_out.get(), dm.w.norm, N, d, static_cast<float>(c.rms_norm_eps), s);
  mark_phase(dm.profile, "final norm", s);
}

template <typename E>
double forward_loss(DeviceModel<E>& dm, DeviceActs<E>& a, const int32_t* targets) {
  const auto& c = dm.cfg;
  const int64_t N = a.B * a.T, d = c.hidden_size, Vp = c.padded_vocab();
  JTOK_CHECK(N > 0 && !a.layers.empty(), "cuda model: forward_loss before forward");
  check_ids(targets, N, c.vocab_size, "target");
  cudaStream_t s = dm.stream;
  JTOK_CUDA_CHECK(cudaMemcpyAsync(a.targets.get(), targets, a.targets.bytes(), cudaMemcpyHostToDevice, s));
  for (int64_t r0 = 0; r0 < N; r0 += a.chunk_rows) {  // logits (rows, Vp) = lnf W_head^T, a chunk at a time
    const int64_t rows = std::min(a.chunk_rows, N - r0);
    dm.mm.template gemm<E, E>(false, true, rows, Vp, d, 1.0f, a.lnf.get() + r0 * d, d, dm.w.lm_head, d, 0.0f,
                              a.logits_chunk.get(), Vp, nullptr, s);
    cross_entropy<E>(nullptr, a.losses.get() + r0, a.logits_chunk.get(), a.targets.get() + r0, rows, c.vocab_size,
                     Vp, 0.0f, s);
  }
  return device_mean(a.losses.get(), a.loss_sum.get(), a.readback, N, s);
}

template void forward<float>(DeviceModel<float>&, DeviceActs<float>&, const int32_t*, int64_t, int64_t);
template void forward<__nv_bfloat16>(DeviceModel<__nv_bfloat16>&, DeviceActs<__nv_bfloat16>&, const int32_t*, int64_t,
                                     int64_t);
template void mlp_update<float>(Matmul&, const ModelConfig&, const DeviceLayerView<float>&, const MlpBuffers<float>&,
                                 const float*, float*, const float*, int64_t, cudaStream_t);
template void mlp_update<__nv_bfloat16>(Matmul&, const ModelConfig&, const DeviceLayerView<__nv_bfloat16>&,
                                         const MlpBuffers<__nv_bfloat16>&, const __nv_bfloat16*, __nv_bfloat16*,
                                         const __nv_bfloat16*, int64_t, cudaStream_t);
template double forward_loss<float>(DeviceModel<float>&, DeviceActs<float>&, const int32_t*);
template double forward_loss<__nv_bfloat16>(DeviceModel<__nv_bfloat16>&, DeviceActs<__nv_bfloat16>&, const int32_t*);

}  // namespace jtok::cuda
