#include "model/transformer.h"

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "core/profile.h"
#include "model/layer_block.h"
#include "model/trainable.h"
#include "ops/attention.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"
#include "ops/swiglu.h"

namespace jtok {

std::vector<ParamInfo> param_layout(const ModelConfig& c) {
  const int64_t d = c.hidden_size, Vp = c.padded_vocab(), F = c.intermediate_size;
  std::vector<ParamInfo> L;
  int64_t off = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    L.push_back({std::move(name), shape, off, n, shape.size() == 2});
    off += n;
  };
  add("model.embed_tokens.weight", {Vp, d});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {d});
    add(p + "self_attn.q_proj.weight", {c.q_dim(), d});
    add(p + "self_attn.k_proj.weight", {c.kv_dim(), d});
    add(p + "self_attn.v_proj.weight", {c.kv_dim(), d});
    add(p + "self_attn.o_proj.weight", {d, c.q_dim()});
    if (c.attention_bias) {
      add(p + "self_attn.q_proj.bias", {c.q_dim()});
      add(p + "self_attn.k_proj.bias", {c.kv_dim()});
      add(p + "self_attn.v_proj.bias", {c.kv_dim()});
    }
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {c.hd()});
      add(p + "self_attn.k_norm.weight", {c.hd()});
    }
    add(p + "post_attention_layernorm.weight", {d});
    if (c.moe_on_layer(l)) {
      // Router, shared experts (one SwiGLU of n_shared * moe_intermediate_size), routed experts.
      const int64_t E = c.n_routed_experts, Fe = c.moe_intermediate_size, S = c.shared_intermediate();
      add(p + "mlp.gate.weight", {E, d});
      if (S > 0) {
        add(p + "mlp.shared_experts.gate_proj.weight", {S, d});
        add(p + "mlp.shared_experts.up_proj.weight", {S, d});
        add(p + "mlp.shared_experts.down_proj.weight", {d, S});
      }
      for (int64_t e = 0; e < E; ++e) {  // back to back: MoeWeights::experts addresses them by stride
        std::string q = p + "mlp.experts." + std::to_string(e) + ".";
        add(q + "gate_proj.weight", {Fe, d});
        add(q + "up_proj.weight", {Fe, d});
        add(q + "down_proj.weight", {d, Fe});
      }
    } else {
      add(p + "mlp.gate_proj.weight", {F, d});
      add(p + "mlp.up_proj.weight", {F, d});
      add(p + "mlp.down_proj.weight", {d, F});
    }
    if (c.jtok_on_layer(l)) add(p + "jtok.scale", {d});
    if (c.jtokm_on_layer(l)) {
      add(p + "jtokm.router.weight", {c.jtokm_n_e, d});
      add(p + "jtokm.scale", {d});
    }
  }
  add("model.norm.weight", {d});
  if (!c.tie_word_embeddings) add("lm_head.weight", {Vp, d});
  return L;
}

ModelView bind_view(float* base, const std::vector<ParamInfo>& layout, const ModelConfig& c) {
  ModelView v;
  size_t i = 0;
  auto next = [&] { return base + layout.at(i++).offset; };
  v.embed = next();
  v.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (size_t l = 0; l < v.layers.size(); ++l) {
    auto& lv = v.layers[l];
    lv.ln1 = next(); lv.wq = next(); lv.wk = next(); lv.wv = next(); lv.wo = next();
    if (c.attention_bias) { lv.bq = next(); lv.bk = next(); lv.bv = next(); }
    if (c.qk_norm) { lv.q_norm = next(); lv.k_norm = next(); }
    lv.ln2 = next();
    if (c.moe_on_layer(static_cast<int64_t>(l))) {
      lv.moe.router = next();
      if (c.shared_intermediate() > 0) { lv.moe.sg = next(); lv.moe.su = next(); lv.moe.sd = next(); }
      lv.moe.experts = next();
      i += static_cast<size_t>(3 * c.n_routed_experts - 1);  // the other expert tensors follow contiguously
    } else {
      lv.wg = next(); lv.wu = next(); lv.wd = next();
    }
    if (c.jtok_on_layer(static_cast<int64_t>(l))) lv.jtok_scale = next();
    if (c.jtokm_on_layer(static_cast<int64_t>(l))) { lv.jtokm_router = next(); lv.jtokm_scale = next(); }
  }
  v.norm = next();
  v.lm_head = c.tie_word_embeddings ? v.embed : next();
  return v;
}

std::string jtok_table_name(int64_t layer) {
  return "model.layers." + std::to_string(layer) + ".jtok.embed.weight";
}

std::string jtokm_table_name(int64_t layer, int64_t i) {
  return "model.layers." + std::to_string(layer) + ".jtokm.embed." + std::to_string(i) + ".weight";
}

RopeTable make_model_rope_table(const ModelConfig& c) {
  RopeScaling llama3{c.rope_scaling_factor, c.rope_scaling_low_freq_factor, c.rope_scaling_high_freq_factor,
                     c.rope_scaling_original_max_position_embeddings};
  return make_rope_table(c.max_position_embeddings, c.hd(), c.rope_theta,
                         c.rope_scaling_type == "llama3" ? &llama3 : nullptr);
}

// The random init of m's parameters (not its tables): gains and scalers constant, biases 0,
// matrices N(0, initializer_range) (o_proj / down_proj scaled by 1/sqrt(2 N_layers)), padded
// vocabulary rows 0.
static void init_dense_params(Model& m, uint64_t seed) {
  const ModelConfig& cfg = m.cfg;
  const double resid_scale = 1.0 / std::sqrt(2.0 * static_cast<double>(cfg.num_hidden_layers));
  // Each tensor its own stream: adding a tensor does not change the others' init, and the tensors
  // are made side by side with the bits of one after another.
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < m.layout.size(); ++i) {
    const auto& p = m.layout[i];
    float* x = m.params.data() + p.offset;
    if (p.shape.size() == 1) {  // RMSNorm gain, a JTok / JTok-M scaler, or a bias (0)
      float v = p.name.ends_with(".bias") ? 0.0f : 1.0f;
      if (p.name.find("jtok.scale") != std::string::npos) v = static_cast<float>(cfg.jtok_scale_init);
      if (p.name.find("jtokm.scale") != std::string::npos) v = static_cast<float>(cfg.jtokm_scale_init);
      std::fill(x, x + p.numel, v);
      continue;
    }
    std::mt19937_64 rng(seed * 1000003ULL + i);
    bool resid = p.name.find("o_proj") != std::string::npos || p.name.find("down_proj") != std::string::npos;
    std::normal_distribution<float> dist(0.0f, static_cast<float>(cfg.initializer_range * (resid ? resid_scale : 1.0)));
    int64_t rows = p.shape[0], cols = p.shape[1];
    bool vocab = p.name == "model.embed_tokens.weight" || p.name == "lm_head.weight";
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = (vocab && r >= cfg.vocab_size) ? 0.0f : dist(rng);
  }
}

static void init_tables(Model& m, uint64_t seed);

Model make_model(const ModelConfig& cfg, uint64_t seed, ModelAlloc alloc) {
  Model m;
  m.cfg = cfg;
  m.layout = param_layout(cfg);
  int64_t total = m.layout.back().offset + m.layout.back().numel;
  m.params = FloatBuffer(static_cast<size_t>(total));
  m.w = bind_view(m.params.data(), m.layout, cfg);
  if (alloc.grads) {
    m.grads = FloatBuffer(static_cast<size_t>(total));
    m.g = bind_view(m.grads.data(), m.layout, cfg);
  }
  m.rope = make_model_rope_table(cfg);
  if (alloc.init) init_dense_params(m, seed);
  // Token-indexed tables: N(0, init_std) on real rows, padded rows 0 (never looked up). Each table
  // its own stream (JTok's numbering kept from before JTok-M existed).
  const int64_t Vp = cfg.padded_vocab(), d = cfg.hidden_size;
  auto add_table = [&](const std::string& name, double std, uint64_t stream) {
    TokenTable t = alloc.tables ? TokenTable::in_ram(Vp, d) : TokenTable::unbound(Vp, d);
    m.table_init.push_back({std, stream});
    m.tables.push_back(std::move(t));
    m.table_grads.emplace_back();
    m.table_grads.back().init(Vp, d);
    m.table_names.push_back(name);
    return static_cast<int>(m.tables.size() - 1);
  };
  m.jtok_table.assign(static_cast<size_t>(cfg.num_hidden_layers), -1);
  m.jtokm_table.assign(static_cast<size_t>(cfg.num_hidden_layers), -1);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    if (cfg.jtok_on_layer(l)) m.jtok_table[l] = add_table(jtok_table_name(l), cfg.jtok_init_std, 500000ULL + l);
    if (cfg.jtokm_on_layer(l))
      for (int64_t i = 0; i < cfg.jtokm_n_e; ++i) {
        int k = add_table(jtokm_table_name(l, i), cfg.jtokm_init_std, 600000ULL + 1000ULL * l + i);
        if (i == 0) m.jtokm_table[l] = k;
      }
  }
  if (alloc.tables && alloc.init) init_tables(m, seed);
  return m;
}

// Each table from its own stream, so the tables fill side by side (a config b + JTok-M model's 60
// tables: seconds instead of a minute) to the same bits as one after another.
static void init_tables(Model& m, uint64_t seed) {
  const int64_t d = m.cfg.hidden_size, n = static_cast<int64_t>(m.tables.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t k = 0; k < n; ++k) {
    float* w = m.tables[static_cast<size_t>(k)].mutable_data();
    for_each_table_init_row(m, seed, k, [&](int64_t r, const float* v) { std::memcpy(w + r * d, v, sizeof(float) * d); });
  }
}

TableInitStream::TableInitStream(const Model& m, uint64_t seed, int64_t k)
    // One stream per table, its values in row-major order over the real rows (as before this was
    // row by row: the same sequence, the same bits).
    : rng_(seed * 1000003ULL + m.table_init.at(static_cast<size_t>(k)).stream),
      dist_(0.0f, static_cast<float>(m.table_init.at(static_cast<size_t>(k)).std)),
      d_(m.cfg.hidden_size),
      real_rows_(m.cfg.vocab_size),
      rows_(m.cfg.padded_vocab()) {}

void TableInitStream::next(float* values) {
  JTOK_CHECK(row_ < rows_, "TableInitStream: all ", rows_, " rows made");
  for (int64_t c = 0; c < d_; ++c) values[c] = row_ < real_rows_ ? dist_(rng_) : 0.0f;
  ++row_;
}

void for_each_table_init_row(const Model& m, uint64_t seed, int64_t k, const std::function<void(int64_t, const float*)>& row) {
  TableInitStream init(m, seed, k);
  std::vector<float> v(static_cast<size_t>(m.cfg.hidden_size));
  for (int64_t r = 0; r < m.cfg.padded_vocab(); ++r) {
    init.next(v.data());
    row(r, v.data());
  }
}

void zero_grads(Model& m) {
  std::fill(m.grads.begin(), m.grads.end(), 0.0f);
  for (auto& g : m.table_grads) g.clear();
}

int64_t num_params(const Model& m) {
  int64_t n = static_cast<int64_t>(m.params.size());
  for (auto& t : m.tables) n += t.numel();
  return n;
}

const ParamInfo& find_param(const Model& m, const std::string& name) {
  for (auto& p : m.layout)
    if (p.name == name) return p;
  fail("no parameter named ", name);
}

void ensure_activations(Activations& a, const ModelConfig& c, int64_t B, int64_t T, ForwardMode mode) {
  const bool inference = mode == ForwardMode::Inference;
  if (a.B == B && a.T == T && a.inference == inference && !a.layers.empty()) return;
  const int64_t N = B * T, d = c.hidden_size, F = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t H = c.num_attention_heads;
  auto sz = [](int64_t n) { return static_cast<size_t>(n); };
  a.B = B;
  a.T = T;
  a.inference = inference;
  a.layers.assign(sz(c.num_hidden_layers), LayerActs{});
  bool any_dense = false, any_jtok = false;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    any_dense |= !c.moe_on_layer(l);
    any_jtok |= c.jtok && c.jtok_on_layer(l);
  }
  for (size_t li = 0; li < a.layers.size(); ++li) {
    auto& l = a.layers[li];
    l.k.resize(sz(N * kvd)); l.v.resize(sz(N * kvd));  // every layer's: the KV cache is filled from them
    if (inference && li > 0) continue;  // the rest is layer 0's, reused by every layer
    l.h_in.resize(sz(N * d)); l.rstd1.resize(sz(N)); l.a.resize(sz(N * d));
    l.q.resize(sz(N * qd));
    l.lse.resize(sz(B * H * T)); l.att.resize(sz(N * qd));
    l.h_mid.resize(sz(N * d)); l.rstd2.resize(sz(N)); l.m.resize(sz(N * d));
    const bool dense = inference ? any_dense : !c.moe_on_layer(static_cast<int64_t>(li));
    if (dense) { l.gate.resize(sz(N * F)); l.up.resize(sz(N * F)); l.act.resize(sz(N * F)); }
    const bool jt = inference ? any_jtok : c.jtok && c.jtok_on_layer(static_cast<int64_t>(li));
    if (jt) l.jtok.mlp_out.resize(sz(N * d));
  }
  a.h_out.resize(sz(N * d)); a.rstdf.resize(sz(N)); a.lnf.resize(sz(N * d));
  // a.logits (N, Vp) is sized by forward(): forward_hidden() alone (prefill) never touches it.
  // The backward scratch is sized by backward(): a forward-only pass (eval, prefill) has none.
}

namespace {
void ensure_backward_scratch(Activations& a, const ModelConfig& c) {
  const int64_t N = a.B * a.T, d = c.hidden_size, F = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  auto sz = [](int64_t n) { return static_cast<size_t>(n); };
  a.dh.resize(sz(N * d)); a.dx.resize(sz(N * d));
  a.dq.resize(sz(N * qd)); a.dk.resize(sz(N * kvd)); a.dv.resize(sz(N * kvd)); a.datt.resize(sz(N * qd));
  a.dgate.resize(sz(N * F)); a.dup.resize(sz(N * F)); a.dact.resize(sz(N * F));
  if (c.jtokm) a.da_jtokm.resize(sz(N * d));
  if (c.jtok) a.dmlp.resize(sz(N * d));
}
}  // namespace

void forward(const Model& m, Activations& a, const int32_t* ids, int64_t B, int64_t T) {
  JTOK_PROFILE("forward (total)");
  forward_hidden(m, a, ids, B, T);
  const int64_t N = B * T, Vp = m.cfg.padded_vocab();
  a.logits.resize(static_cast<size_t>(N * Vp));
  { JTOK_PROFILE("lm_head_fwd"); linear_forward_lowp(a.logits.data(), a.lnf.data(), head_matrix(m, Vp), N); }
}

void forward_hidden(const Model& m, Activations& a, const int32_t* ids, int64_t B, int64_t T, ForwardMode mode) {
  const auto& c = m.cfg;
  JTOK_CHECK(T <= c.max_position_embeddings, "sequence length ", T, " > max_position_embeddings");
  { JTOK_PROFILE("activations_alloc"); ensure_activations(a, c, B, T, mode); }
  const bool shared = mode == ForwardMode::Inference;
  const int64_t N = B * T, d = c.hidden_size;
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, hd = c.hd();
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (int64_t n = 0; n < N; ++n)
    if (ids[n] < 0 || ids[n] >= c.vocab_size) fail("token id ", ids[n], " outside the vocabulary [0, ", c.vocab_size, ")");
  embed_rows(m, a.layers[0].h_in.data(), ids, N);
  if (c.jtok || c.jtokm) { JTOK_PROFILE("jtok_dedup"); a.ids = dedup_ids(ids, N, c.padded_vocab()); }
  if (a.tables && c.jtok) a.tables->prefetch(a.ids);  // every JTok layer's rows, fetched during the backbone
  LayerKernels kn;  // the fastest kernels; RoPE at 0..T-1 in each of the B sequences
  kn.B = B;
  kn.T = T;
  kn.keep_for_backward = !shared;
  kn.row_sync = a.row_sync;
  kn.tables = a.tables;
  double aux = 0, aux_m = 0;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    // Inference: layer 0's buffers serve every layer (its input h_in is read before the layer
    // writes its output there) except k and v, kept per layer for the KV cache.
    auto& L = a.layers[shared ? 0 : l];
    if (a.tables) a.tables->poll();
    float* h_next = l + 1 < a.layers.size() ? a.layers[shared ? 0 : l + 1].h_in.data() : a.h_out.data();
    const LayerBuffers buf{L.h_in.data(), L.h_mid.data(), h_next, L.a.data(), L.rstd1.data(), L.q.data(),
                           a.layers[l].k.data(), a.layers[l].v.data(), L.att.data(), L.m.data(), L.rstd2.data(),
                           L.gate.data(), L.up.data(), L.act.data(), &L.qk, &L.jtok, &L.jtokm, &L.moe, nullptr};
    auto attend = [&](float* att, const float* q, const float* k, const float* v) {
      attention_forward(att, L.lse.data(), q, k, v, B, T, H, KV, hd);
    };
    layer_forward(m, static_cast<int64_t>(l), buf, a.ids, N, kn, attend);
    if (m.w.layers[l].moe.router) aux += L.moe.aux;
    if (m.w.layers[l].jtokm_router) aux_m += L.jtokm.aux;
  }
  a.moe_aux_loss = c.moe_num_layers() > 0 ? aux / static_cast<double>(c.moe_num_layers()) : 0.0;
  a.jtokm_aux_loss = c.jtokm_num_layers() > 0 ? aux_m / static_cast<double>(c.jtokm_num_layers()) : 0.0;
  a.aux_loss = a.moe_aux_loss + a.jtokm_aux_loss;
  check_table_reads(m.tables);  // a disk table's failed read ends this forward, naming the file
  rmsnorm_forward(a.lnf.data(), a.rstdf.data(), a.h_out.data(), m.w.norm, N, d, eps);
}

double loss_of_logits(const Model& m, const Activations& a, const int32_t* targets) {
  const int64_t N = a.B * a.T;
  return cross_entropy(nullptr, a.logits.data(), targets, N, m.cfg.vocab_size, m.cfg.padded_vocab(), 0.0f) /
         static_cast<double>(N);
}

void token_logprobs(const Model& m, const Activations& a, const int32_t* targets, float* out) {
  const int64_t N = a.B * a.T, Vp = m.cfg.padded_vocab();
  cross_entropy_rows(out, a.logits.data(), targets, N, m.cfg.vocab_size, Vp);
  for (int64_t n = 0; n < N; ++n) out[n] = -out[n];
}

namespace {
void zero(std::vector<float>& v) { std::fill(v.begin(), v.end(), 0.0f); }

// The step's mean cross-entropy, and its gradient (times grad_scale) back through the LM head and
// the final norm into a.dh = dL/dh_out; the logits become dlogits.
double head_backward(const Model& m, Activations& a, ModelView& gv, const int32_t* targets, float grad_scale) {
  const auto& c = m.cfg;
  const int64_t N = a.B * a.T, d = c.hidden_size, Vp = c.padded_vocab();
  for (int64_t n = 0; n < N; ++n)
    if (targets[n] < 0 || targets[n] >= c.vocab_size)
      fail("target id ", targets[n], " outside the vocabulary [0, ", c.vocab_size, ")");
  // dlogits in place of the logits.
  double loss;
  { JTOK_PROFILE("cross_entropy"); loss = cross_entropy(a.logits.data(), a.logits.data(), targets, N, c.vocab_size, Vp,
                              grad_scale / static_cast<float>(N)) / static_cast<double>(N); }
  // Head: dlnf -> dx; final norm -> dh.
  zero(a.dx);
  { JTOK_PROFILE("lm_head_bwd"); linear_backward(a.dx.data(), gv.lm_head, a.logits.data(), a.lnf.data(), m.w.lm_head, N, d, Vp); }
  zero(a.dh);
  rmsnorm_backward(a.dh.data(), gv.norm, a.dx.data(), a.h_out.data(), m.w.norm, a.rstdf.data(), N, d);
  return loss;
}

// Layer li's MLP half: a.dh = dL/dh_next in, dL/dh_mid out, where h_next = h_mid + the MLP (or MoE)
// update of norm2(h_mid), gated by JTok (the update's gradient is dh * p), JTok-M's injection beside it.
void mlp_half_backward(Model& m, Activations& a, LayerView& G, size_t li, float grad_scale) {
  const auto& c = m.cfg;
  auto& L = a.layers[li];
  const auto& W = m.w.layers[li];
  const int64_t N = a.B * a.T, d = c.hidden_size, F = c.intermediate_size;
  float* dh = a.dh.data();
  float* dx = a.dx.data();
  const float* dmlp = dh;
  if (a.tables) a.tables->poll();
  if (W.jtokm_router) {  // JTok-M's injection: dL/de from dh = dL/dh_next now (posted to a provider);
    JTOK_PROFILE("jtokm_bwd");  // the router's part, into its input a, after the attention backward
    jtokm_backward_de(G.jtokm_scale, L.jtokm, dh, W.jtokm_scale, N, d, jtokm_hyper(c), a.tables, m.jtokm_table[li]);
  }
  if (W.jtok_scale) {
    JTOK_PROFILE("jtok_bwd");
    // With a table provider the micro-batch's row gradient goes to it (the rows' owners) at once.
    SparseRowGrad& gE = a.tables ? a.table_grad_scratch : m.table_grads[m.jtok_table[li]];
    if (a.tables && static_cast<int64_t>(gE.slot.size()) != c.padded_vocab()) gE.init(c.padded_vocab(), d);
    jtok_backward(a.dmlp.data(), G.jtok_scale, gE, dh, L.jtok, W.jtok_scale, a.ids, N, d, c.jtok_norm);
    if (a.tables) a.tables->row_grads(m.jtok_table[li], gE);
    dmlp = a.dmlp.data();
  }
  zero(a.dx);
  if (W.moe.router) {
    // The step loss is LM + mean over MoE layers of aux, so each layer's aux has weight 1/L_moe.
    JTOK_PROFILE("moe_bwd");
    moe_backward(dx, G.moe, a.moe_scratch, dmlp, L.m.data(), L.moe, W.moe, moe_dims(c), N,
                 grad_scale / static_cast<float>(c.moe_num_layers()));
  } else {
    zero(a.dact);
    linear_backward(a.dact.data(), G.wd, dmlp, L.act.data(), W.wd, N, F, d);
    { JTOK_PROFILE("swiglu_bwd"); swiglu_backward(a.dgate.data(), a.dup.data(), a.dact.data(), L.gate.data(), L.up.data(), N * F); }
    const LinearGrad gu[2] = {{G.wg, a.dgate.data(), W.wg, F}, {G.wu, a.dup.data(), W.wu, F}};
    linear_backward_many(dx, gu, 2, L.m.data(), N, d);  // the same values as one call each
  }
  { JTOK_PROFILE("rmsnorm_bwd"); rmsnorm_backward(dh, G.ln2, dx, L.h_mid.data(), W.ln2, L.rstd2.data(), N, d); }  // dh: d h_mid
}

// Layer li's attention half: a.dh = dL/dh_mid in, dL/dh_in out, where h_mid = h_in + att @ Wo^T and
// the attention input a = norm1(h_in) also feeds JTok-M's router.
void attention_half_backward(Model& m, Activations& a, LayerView& G, size_t li, float jtokm_aux_grad) {
  const auto& c = m.cfg;
  auto& L = a.layers[li];
  const auto& W = m.w.layers[li];
  const int64_t B = a.B, T = a.T, N = B * T, d = c.hidden_size;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), H = c.num_attention_heads, KV = c.num_key_value_heads, hd = c.hd();
  float* dh = a.dh.data();
  float* dx = a.dx.data();
  if (a.tables) a.tables->poll();
  zero(a.datt);
  linear_backward(a.datt.data(), G.wo, dh, L.att.data(), W.wo, N, qd, d);
  if (a.tables) a.tables->poll();
  zero(a.dq); zero(a.dk); zero(a.dv);
  { JTOK_PROFILE("attn_bwd"); attention_backward(a.dq.data(), a.dk.data(), a.dv.data(), a.datt.data(), L.att.data(), L.lse.data(), L.q.data(), L.k.data(),
                     L.v.data(), B, T, H, KV, hd); }
  if (a.tables) a.tables->poll();
  {
    JTOK_PROFILE("rope_bwd");
    rope_backward(a.dq.data(), m.rope, B, T, H, hd);
    rope_backward(a.dk.data(), m.rope, B, T, KV, hd);
  }
  qkv_variants_backward(W, G, a.dq.data(), a.dk.data(), a.dv.data(), L.qk, N, H, KV, hd);
  // d a: JTok-M's router part plus the q/k/v projections'.
  if (W.jtokm_router) {
    JTOK_PROFILE("jtokm_bwd");
    zero(a.da_jtokm);
    jtokm_backward_router(a.da_jtokm.data(), G.jtokm_router, &m.table_grads[m.jtokm_table[li]], L.jtokm, L.a.data(),
                          W.jtokm_router, a.ids, N, d, jtokm_hyper(c), jtokm_aux_grad, a.tables, m.jtokm_table[li]);
    std::memcpy(dx, a.da_jtokm.data(), sizeof(float) * N * d);
  }
  else zero(a.dx);
  const LinearGrad qkv[3] = {{G.wq, a.dq.data(), W.wq, qd}, {G.wk, a.dk.data(), W.wk, kvd}, {G.wv, a.dv.data(), W.wv, kvd}};
  linear_backward_many(dx, qkv, 3, L.a.data(), N, d);
  { JTOK_PROFILE("rmsnorm_bwd"); rmsnorm_backward(dh, G.ln1, dx, L.h_in.data(), W.ln1, L.rstd1.data(), N, d); }  // dh: d h_in
}
}  // namespace

double backward(Model& m, Activations& a, const int32_t* ids, const int32_t* targets, float grad_scale) {
  JTOK_PROFILE("backward (total)");
  const auto& c = m.cfg;
  if (a.inference) fail("backward after a forward in ForwardMode::Inference (its activations are not kept)");
  if (m.lowp.any()) fail("backward on a model with ", dtype_name(m.lowp.dtype), " weights: they are for inference only");
  ensure_backward_scratch(a, c);
  ModelView gv = trainable_grad_view(m);  // m.g, or with a frozen backbone the token-indexed modules' only
  // The step loss has the mean of the JTok-M layers' aux losses: each layer's weight is 1/#layers.
  const float jtokm_aux_grad = c.jtokm ? grad_scale / static_cast<float>(c.jtokm_num_layers()) : 0.0f;
  const double loss = head_backward(m, a, gv, targets, grad_scale);
  for (size_t li = a.layers.size(); li-- > 0;) {
    mlp_half_backward(m, a, gv.layers[li], li, grad_scale);
    attention_half_backward(m, a, gv.layers[li], li, jtokm_aux_grad);
    if (a.on_layer_grads_ready) a.on_layer_grads_ready(static_cast<int64_t>(li));
  }
  { JTOK_PROFILE("embed_bwd"); if (gv.embed) embedding_backward(gv.embed, a.dh.data(), ids, a.B * a.T, c.hidden_size); }
  return loss;
}

}  // namespace jtok
