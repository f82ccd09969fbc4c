// The device model's set-up (src/cuda/model.h): the parameters copied in the host's flat layout,
// views of the device buffers at the host's offsets, the activations sized for (B,T), and the
// copies back to the host.
#include <algorithm>
#include <string>

#include "core/dtype.h"
#include "cuda/dedup.h"
#include "cuda/embedding.h"
#include "cuda/jtok.h"
#include "cuda/jtokm.h"
#include "cuda/model.h"
#include "cuda/model_kernels.h"
#include "cuda/rmsnorm.h"
#include "cuda/table_rows.h"
#include "model/trainable.h"

namespace jtok::cuda {

void check_device_supported(const Model& host, const std::string& who, bool lowp_weights) {
  const auto& c = host.cfg;
  for (size_t l = 0; l < host.w.layers.size(); ++l) {
    const LayerView& W = host.w.layers[l];
    const std::string at = who + ": layer " + std::to_string(l) + " ";
    if (W.moe.router && c.num_experts_per_tok > kMoeMaxTopK)
      fail(at, "routes each token to num_experts_per_tok ", c.num_experts_per_tok, " experts: the GPU takes at most ",
           kMoeMaxTopK);
  }
  if (host.lowp.any() && !lowp_weights)
    fail(who, ": low-precision (exported) ", dtype_name(host.lowp.dtype),
         " weights are inference-only: training, on the GPU as on the CPU, starts from an fp32 checkpoint");
  if (c.hd() != 32 && c.hd() != 64 && c.hd() != 128)
    fail(who, ": head_dim ", c.hd(), " (the GPU attention runs head_dim 32, 64 or 128)");
  for (size_t k = 0; k < host.tables.size(); ++k) {
    const TokenTable& t = host.tables[k];
    if (t.rows != c.padded_vocab() || t.id_first != 0 || t.id_stride != 1 || t.dim != c.hidden_size)
      fail(who, ": table ", host.table_names[k], " is not a whole (", c.padded_vocab(), ", ", c.hidden_size,
           ") table (rows ", t.rows, ", dim ", t.dim, "): a shard is not on the GPU");
  }
  if (host.rope.half * 2 != c.hd()) fail(who, ": the RoPE table's half width ", host.rope.half, " != head_dim/2");
}

namespace {

// dm.product_grads (the weight products' gradients: model.h's DeviceModel::grads_fresh) from the
// gradient views, and dm.zeroed_grads: every trainable tensor outside them, adjacent ones one span.
template <typename E>
void plan_grad_spans(DeviceModel<E>& dm) {
  const ModelConfig& c = dm.cfg;
  const int64_t d = c.hidden_size, qd = c.q_dim(), F = c.intermediate_size;
  auto product = [&](const float* g, int64_t n) {
    if (g) dm.product_grads.push_back({g - dm.grads.get(), n});
  };
  for (size_t l = 0; l < dm.g.layers.size(); ++l) {
    const auto& G = dm.g.layers[l];
    product(G.wq, (qd + 2 * c.kv_dim()) * d);  // [Wq; Wk; Wv], one product (require_fused_layout)
    product(G.wo, d * qd);
    if (c.moe_on_layer(static_cast<int64_t>(l))) continue;  // the MoE block's products add (model_moe)
    product(G.wg, 2 * F * d);  // [Wg; Wu]
    product(G.wd, d * F);
  }
  if (!c.tie_word_embeddings) product(dm.g.lm_head, c.padded_vocab() * d);  // tied: the embedding's rows add
  std::vector<Span> zeroed;
  for (size_t i = 0; i < dm.layout.size(); ++i) {
    const ParamInfo& p = dm.layout[i];
    const bool in_product = std::any_of(dm.product_grads.begin(), dm.product_grads.end(), [&](const Span& s) {
      return p.offset >= s.offset && p.offset < s.offset + s.count;
    });
    const bool row_sparse = dm.embed_rows_on() && p.offset == dm.embed_offset();  // cleared by its rows
    if (!dm.trainable[i] || in_product || row_sparse || p.numel == 0) continue;
    if (!zeroed.empty() && zeroed.back().offset + zeroed.back().count == p.offset)
      zeroed.back().count += p.numel;
    else
      zeroed.push_back({p.offset, p.numel});
  }
  dm.zeroed_grads = upload_spans(zeroed);
}

}  // namespace

template <typename P>
DeviceView<P> device_view(P* base, const Model& host, const ModelView& hv) {
  const float* hb = host.params.data();
  return map_view<P>(hv, [&](const float* p) -> P* { return base + (p - hb); });
}

template <typename E>
DeviceModel<E>::DeviceModel(const Model& host, cudaStream_t s)
    : cfg(host.cfg), layout(host.layout), n_params(static_cast<int64_t>(host.params.size())), stream(s) {
  check_device_supported(host, "cuda model", false);
  for (const ParamInfo& p : layout) trainable.push_back(param_trainable(host, p) ? 1 : 0);
  master.resize(n_params);
  copy_to_device(master.get(), host.params.data(), n_params);
  if constexpr (!std::is_same_v<E, float>) {
    copy.resize(n_params);
    convert_from_f32(copy.get(), master.get(), n_params, stream);
  }
  grads.resize(n_params);
  grads.zero(stream);
  rope_T = host.rope.T;
  const int64_t rope_n = host.rope.T * host.rope.half;
  rope_cos.resize(rope_n);
  rope_sin.resize(rope_n);
  copy_to_device(rope_cos.get(), host.rope.cos.data(), rope_n);
  copy_to_device(rope_sin.get(), host.rope.sin.data(), rope_n);
  upload_tables(host);
  w = device_view(weights(), host);
  g = device_view(grads.get(), host, trainable_view(host, host.w));  // a frozen tensor's null: no dW product
  require_fused_layout(w, cfg, "cuda model");                        // model/transformer.cpp's layout always is
  if (g.embed && !cfg.tie_word_embeddings) {                         // tied: the LM head writes every row a step
    embed_flags.allocate(cfg.padded_vocab(), stream);
  }
  plan_grad_spans(*this);
}

// The token tables (f32 in memory: TokenTable::data() names the table otherwise) side by side,
// their bf16 copy, zeroed gradients and touched flags (the only whole-table clear: afterwards only
// the listed rows are), the touched list's room.
template <typename E>
void DeviceModel<E>::upload_tables(const Model& host) {
  jtok_table = host.jtok_table;
  jtokm_table = host.jtokm_table;
  n_tables = static_cast<int64_t>(host.tables.size());
  table_numel = cfg.padded_vocab() * cfg.hidden_size;
  tables.resize(n_tables * table_numel);
  for (int64_t k = 0; k < n_tables; ++k)
    copy_to_device(tables.get() + k * table_numel, host.tables[static_cast<size_t>(k)].data(), table_numel);
  if constexpr (!std::is_same_v<E, float>) {
    table_copy.resize(tables.size());
    convert_from_f32(table_copy.get(), tables.get(), tables.size(), stream);
  }
  table_grads.resize(tables.size());
  table_grads.zero(stream);
  table_flags.allocate(n_tables * cfg.padded_vocab(), stream);
}

namespace {

template <typename E>
void size_layer(DeviceLayerActs<E>& l, const DeviceModel<E>& dm, bool jtok, bool jtokm, int64_t B, int64_t T) {
  const ModelConfig& c = dm.cfg;
  const int64_t N = B * T, d = c.hidden_size, F = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads;
  l.h_in.resize(N * d), l.a.resize(N * d), l.h_mid.resize(N * d), l.m.resize(N * d), l.att.resize(N * qd);
  l.q.resize(N * (qd + 2 * kvd)), l.gate.resize(N * 2 * F), l.act.resize(N * F);
  l.rstd1.resize(N), l.rstd2.resize(N), l.lse.resize(B * H * T);
  l.q_in.resize(c.qk_norm ? N * (qd + 2 * kvd) : 0);
  l.rstd_q.resize(c.qk_norm ? N * H : 0), l.rstd_k.resize(c.qk_norm ? N * KV : 0);
  l.mlp_out.resize(jtok ? N * d : 0), l.nrows.resize(jtok ? N * d : 0), l.inv_norm.resize(jtok ? N : 0);
  const int64_t ne = jtokm ? c.jtokm_n_e : 0, K = jtokm ? c.jtokm_top_k : 0;
  l.m_logits.resize(N * ne), l.m_sig.resize(N * ne), l.m_w.resize(N * K), l.m_sel.resize(N * K);
  l.m_inv_norm.resize(jtokm ? N : 0), l.m_chosen.resize(jtokm ? N : 0);
  l.m_load.resize(ne), l.m_prob_sum.resize(ne), l.m_wsum.resize(ne);
}

// An MoE layer: the block's routing and experts' activations in place of the dense MLP's.
template <typename E>
void size_moe_layer(DeviceLayerActs<E>& l, const ModelConfig& c, int64_t N) {
  l.gate.resize(0), l.act.resize(0);
  size_moe_acts(l.moe, moe_dims(c), N);
}

template <typename E>
void size_backward(DeviceActs<E>& a, const DeviceModel<E>& dm, bool jtok, bool jtokm, int64_t B, int64_t T) {
  const ModelConfig& c = dm.cfg;
  const int64_t N = B * T, d = c.hidden_size, F = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, hd = c.hd();
  a.dh.resize(N * d), a.dx.resize(N * d), a.datt.resize(N * qd);
  a.dq.resize(N * (qd + 2 * kvd)), a.dgate.resize(N * 2 * F), a.dact.resize(N * F);
  a.row_terms.resize(B * H * T);
  a.dmlp.resize(jtok ? N * d : 0), a.jtok_scratch.resize(jtok ? jtok_backward_scratch(N, d) : 0);
  a.m_de.resize(jtokm ? N * d : 0), a.m_dg.resize(jtokm ? N * c.jtokm_n_e : 0);
  a.m_scratch.resize(jtokm ? jtokm_backward_de_scratch(jtokm_dims(c, N)) : 0);
  a.m_hot.resize(jtokm ? jtokm_backward_tables_scratch(jtokm_dims(c, N)) : 0);
  a.embed_hot.resize(embedding_backward_scratch(N, d));
  int64_t scratch = rmsnorm_backward_scratch(N, d);
  if (c.qk_norm)
    for (int64_t rows : {N * H, N * KV}) scratch = std::max(scratch, rmsnorm_backward_scratch(rows, hd));
  if (c.attention_bias) scratch = std::max(scratch, bias_grad_scratch(N, qd + 2 * kvd));  // q | k | v biases
  a.norm_scratch.resize(scratch);
  a.unique.resize(N), a.inverse.resize(N), a.order.resize(N), a.offsets.resize(N + 1), a.num_unique.resize(1);
  a.positions.resize(N + 1), a.position_count.resize(1);
  a.dedup_scratch.resize(static_cast<int64_t>(dedup_scratch_bytes(N, c.padded_vocab())));
}

}  // namespace

template <typename E>
void ensure_device_activations(DeviceActs<E>& a, const DeviceModel<E>& dm, int64_t B, int64_t T, int64_t chunk_rows) {
  const ModelConfig& c = dm.cfg;
  const int64_t N = B * T, d = c.hidden_size;
  JTOK_CHECK(N > 0, "cuda model: an empty batch (B ", B, ", T ", T, ")");
  if (chunk_rows <= 0 || chunk_rows > N) chunk_rows = N;
  if (a.B == B && a.T == T && a.chunk_rows == chunk_rows && !a.layers.empty()) return;
  a.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  bool any_jtok = false, any_jtokm = false, any_moe = false;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const bool jtok = dm.w.layers[l].jtok_scale != nullptr, jtokm = dm.w.layers[l].jtokm_router != nullptr;
    size_layer(a.layers[l], dm, jtok, jtokm, B, T);
    if (dm.w.layers[l].moe.router) size_moe_layer(a.layers[l], c, N);
    any_moe |= dm.w.layers[l].moe.router != nullptr;
    any_jtok |= jtok;
    any_jtokm |= jtokm;
  }
  a.h_out.resize(N * d), a.lnf.resize(N * d), a.logits_chunk.resize(chunk_rows * c.padded_vocab());
  a.rstdf.resize(N), a.losses.resize(N), a.loss_sum.resize(1), a.ids.resize(N), a.targets.resize(N);
  size_backward(a, dm, any_jtok, any_jtokm, B, T);
  size_moe_scratch(a.moe, moe_dims(c), any_moe ? N : 0);
  a.B = B, a.T = T, a.chunk_rows = chunk_rows;
}

int64_t lm_head_chunk_rows(int64_t Vp, int64_t elem_bytes) {
  const int64_t budget = int64_t{1} << 30;
  return std::max<int64_t>(128, budget / (Vp * elem_bytes) / 128 * 128);
}

JTokMDims jtokm_dims(const ModelConfig& c, int64_t N) {
  const JTokMHyper h = jtokm_hyper(c);
  JTokMDims dims;
  dims.N = N, dims.d = c.hidden_size, dims.V = c.padded_vocab(), dims.n_e = h.n_e, dims.K = h.K;
  dims.c = h.c, dims.eps = h.eps, dims.norm = h.norm, dims.lambda = h.lambda;
  return dims;
}

template <typename E>
void zero_grads(DeviceModel<E>& dm) {
  zero_spans(dm.grads.get(), dm.zeroed_grads, dm.stream);
  dm.grads_fresh = true;
  if (dm.embed_flags.flagged) dm.embed_flags.clear(dm.g.embed, dm.cfg.hidden_size, dm.stream);
  if (dm.table_flags.flagged) dm.table_flags.clear(dm.table_grads.get(), dm.cfg.hidden_size, dm.stream);
}

template <typename E>
std::vector<float> download_params(const DeviceModel<E>& dm) {
  std::vector<float> h(static_cast<size_t>(dm.n_params));
  copy_to_host(h.data(), dm.master.get(), dm.n_params, dm.stream);
  return h;
}

template <typename E>
std::vector<float> download_grads(const DeviceModel<E>& dm) {
  std::vector<float> h(static_cast<size_t>(dm.n_params));
  copy_to_host(h.data(), dm.grads.get(), dm.n_params, dm.stream);
  if (dm.grads_fresh)  // no backward since zero_grads: the products' spans hold nothing of this step
    for (const Span& s : dm.product_grads) std::fill_n(h.begin() + s.offset, s.count, 0.0f);
  return h;
}

template <typename E>
std::vector<float> download_table_grad(const DeviceModel<E>& dm, int64_t k) {
  JTOK_CHECK(k >= 0 && k < dm.n_tables, "cuda model: no table ", k);
  std::vector<float> h(static_cast<size_t>(dm.table_numel));
  copy_to_host(h.data(), dm.table_grad(k), dm.table_numel, dm.stream);
  const std::vector<uint8_t> flags = download_table_touched(dm, k);
  const auto d = static_cast<size_t>(dm.cfg.hidden_size);
  for (size_t r = 0; r < flags.size(); ++r)
    if (!flags[r]) std::fill_n(h.begin() + static_cast<std::ptrdiff_t>(r * d), d, 0.0f);  // stale values
  return h;
}

template <typename E>
std::vector<float> download_table(const DeviceModel<E>& dm, int64_t k) {
  JTOK_CHECK(k >= 0 && k < dm.n_tables, "cuda model: no table ", k);
  std::vector<float> h(static_cast<size_t>(dm.table_numel));
  copy_to_host(h.data(), dm.tables.get() + k * dm.table_numel, dm.table_numel, dm.stream);
  return h;
}

template <typename E>
std::vector<uint8_t> download_table_touched(const DeviceModel<E>& dm, int64_t k) {
  JTOK_CHECK(k >= 0 && k < dm.n_tables, "cuda model: no table ", k);
  std::vector<uint8_t> h(static_cast<size_t>(dm.cfg.padded_vocab()));
  copy_to_host(h.data(), dm.touched(k), dm.cfg.padded_vocab(), dm.stream);
  return h;
}

#define JTOK_MODEL_SETUP_INSTANTIATE(E)                                                                         \
  template struct DeviceModel<E>;                                                                               \
  template DeviceView<E> device_view<E>(E*, const Model&, const ModelView&);                                    \
  template void ensure_device_activations<E>(DeviceActs<E>&, const DeviceModel<E>&, int64_t, int64_t, int64_t); \
  template std::vector<float> download_table_grad<E>(const DeviceModel<E>&, int64_t);                           \
  template std::vector<float> download_table<E>(const DeviceModel<E>&, int64_t);                                \
  template std::vector<uint8_t> download_table_touched<E>(const DeviceModel<E>&, int64_t);                      \
  template void zero_grads<E>(DeviceModel<E>&);                                                                 \
  template std::vector<float> download_params<E>(const DeviceModel<E>&);                                        \
  template std::vector<float> download_grads<E>(const DeviceModel<E>&);
JTOK_MODEL_SETUP_INSTANTIATE(float)
JTOK_MODEL_SETUP_INSTANTIATE(__nv_bfloat16)
#undef JTOK_MODEL_SETUP_INSTANTIATE

}  // namespace jtok::cuda
