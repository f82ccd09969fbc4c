#include "infer/generate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/profile.h"
#include "model/jtok.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

namespace jtok {

std::vector<float> prefill(const Model& m, KVCache& cache, const std::vector<int32_t>& prompt, int64_t capacity) {
  const auto& c = m.cfg;
  if (prompt.empty()) fail("empty prompt: give at least one token");
  if (capacity > c.max_position_embeddings) capacity = c.max_position_embeddings;
  const int64_t T = static_cast<int64_t>(prompt.size());
  if (T > capacity) fail("prompt of ", T, " tokens is longer than the context (", capacity, ")");
  JTOK_PROFILE("prefill (total)");
  Activations a;
  forward_hidden(m, a, prompt.data(), 1, T, ForwardMode::Inference);  // the head only for the last position, below
  const int64_t kvd = c.kv_dim();
  cache.len = T;
  cache.capacity = capacity;
  cache.k.assign(a.layers.size(), std::vector<float>(static_cast<size_t>(capacity * kvd)));
  cache.v.assign(a.layers.size(), std::vector<float>(static_cast<size_t>(capacity * kvd)));
  for (size_t l = 0; l < a.layers.size(); ++l) {
    std::memcpy(cache.k[l].data(), a.layers[l].k.data(), sizeof(float) * T * kvd);
    std::memcpy(cache.v[l].data(), a.layers[l].v.data(), sizeof(float) * T * kvd);
  }
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  linear_forward(logits.data(), a.lnf.data() + (T - 1) * c.hidden_size, m.w.lm_head, 1, c.hidden_size,
                 c.vocab_size);  // real rows only, as decode_step
  return logits;
}

std::vector<float> decode_step(const Model& m, KVCache& cache, int32_t token) {
  const auto& c = m.cfg;
  if (cache.len >= cache.capacity) fail("context full: ", cache.capacity, " tokens");
  if (token < 0 || token >= c.vocab_size) fail("token id ", token, " outside the vocabulary");
  const int64_t d = c.hidden_size, F = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, hd = c.hd(), t = cache.len;
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<float> h(m.w.embed + token * d, m.w.embed + (token + 1) * d);
  std::vector<float> x(d), q(qd), att(qd), gate(F), up(F), act(F), scratch(t + 1);
  float rstd;
  JTokActs jt;      // JTok layers: the one position's gathered row and ungated MLP update
  JTokMActs jm;     // JTok-M layers: the position's routing
  std::vector<float> inject(static_cast<size_t>(d));  // JTok-M's Delta_r, routed on the attention input
  const JTokMHyper jmh = jtokm_hyper(c);
  RowBatch rb;
  if (c.jtok || c.jtokm) rb = dedup_ids(&token, 1, c.padded_vocab());
  for (size_t l = 0; l < m.w.layers.size(); ++l) {
    const auto& W = m.w.layers[l];
    rmsnorm_forward(x.data(), &rstd, h.data(), W.ln1, 1, d, eps);
    if (W.jtokm_router) {
      std::fill(inject.begin(), inject.end(), 0.0f);
      jtokm_forward(inject.data(), jm, x.data(), W.jtokm_router, W.jtokm_scale, &m.tables[m.jtokm_table[l]], rb, 1, d,
                    jmh);
    }
    float* kt = cache.k[l].data() + t * kvd;
    float* vt = cache.v[l].data() + t * kvd;
    linear_forward(q.data(), x.data(), W.wq, 1, d, qd);
    linear_forward(kt, x.data(), W.wk, 1, d, kvd);
    linear_forward(vt, x.data(), W.wv, 1, d, kvd);
    rope_forward(q.data(), m.rope, 1, 1, H, hd, t);
    rope_forward(kt, m.rope, 1, 1, KV, hd, t);
    attention_decode(att.data(), q.data(), cache.k[l].data(), cache.v[l].data(), t, H, KV, hd, scratch.data());
    gemm(false, true, 1, d, qd, 1.0f, att.data(), qd, W.wo, qd, 1.0f, h.data(), d);
    rmsnorm_forward(x.data(), &rstd, h.data(), W.ln2, 1, d, eps);
    // The MLP (or MoE) update of this position, then its write-back, gated by JTok where on.
    jt.mlp_out.assign(static_cast<size_t>(d), 0.0f);
    if (W.moe.router) {  // MoE block on one position (its aux loss is unused here)
      MoeActs ma;
      moe_forward(jt.mlp_out.data(), ma, x.data(), W.moe, moe_dims(c), 1);
    } else {
      linear_forward(gate.data(), x.data(), W.wg, 1, d, F);
      linear_forward(up.data(), x.data(), W.wu, 1, d, F);
      swiglu_forward(act.data(), gate.data(), up.data(), F);
      linear_forward(jt.mlp_out.data(), act.data(), W.wd, 1, F, d);
    }
    if (W.jtok_scale) {  // h += Delta_m * (1 + s * Norm(E[token])), as forward() does
      jtok_prepare(jt, m.tables[m.jtok_table[l]], rb, static_cast<float>(c.jtok_eps), c.jtok_norm);
      jtok_forward(h.data(), h.data(), jt, W.jtok_scale, rb, 1, d);
    } else {
      for (int64_t j = 0; j < d; ++j) h[j] += jt.mlp_out[j];
    }
    if (W.jtokm_router)
      for (int64_t j = 0; j < d; ++j) h[j] += inject[j];
  }
  rmsnorm_forward(x.data(), &rstd, h.data(), m.w.norm, 1, d, eps);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  linear_forward(logits.data(), x.data(), m.w.lm_head, 1, d, c.vocab_size);  // real rows only
  cache.len += 1;
  return logits;
}

int32_t sample_token(const std::vector<float>& logits, const SamplingParams& p, std::mt19937_64& rng) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (p.temperature <= 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  if (p.top_k <= 0 && p.top_p >= 1.0) {  // plain temperature sampling: no ordering needed
    const double mx = *std::max_element(logits.begin(), logits.end());
    std::vector<double> w(static_cast<size_t>(V));
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += (w[i] = std::exp((logits[i] - mx) / p.temperature));
    double r = std::uniform_real_distribution<double>(0.0, sum)(rng);
    for (int64_t i = 0; i < V; ++i) {
      r -= w[i];
      if (r <= 0) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(V - 1);
  }
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  int64_t keep = V;
  if (p.top_k > 0 && p.top_k < V) {
    keep = p.top_k;
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  } else {
    std::sort(idx.begin(), idx.end(),
              [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  }
  std::vector<double> prob(static_cast<size_t>(keep));
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += (prob[i] = std::exp((logits[idx[i]] - mx) / p.temperature));
  if (p.top_p < 1.0) {  // smallest prefix with cumulative probability >= top_p
    double cum = 0;
    int64_t cut = keep;
    for (int64_t i = 0; i < keep; ++i) {
      cum += prob[i] / sum;
      if (cum >= p.top_p) { cut = i + 1; break; }
    }
    keep = cut;
    sum = std::accumulate(prob.begin(), prob.begin() + keep, 0.0);
  }
  double r = std::uniform_real_distribution<double>(0.0, sum)(rng);
  for (int64_t i = 0; i < keep; ++i) {
    r -= prob[i];
    if (r <= 0) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace jtok
