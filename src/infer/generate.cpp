#include "infer/generate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/profile.h"
#include "model/jtok.h"
#include "model/layer_block.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/lowp_linear.h"
#include "ops/rmsnorm.h"

namespace jtok {

// Logits of n final-normed hidden rows (n, d) in blocks of kHeadBlock rows, each handed to `each`
// with its position (the first row's is pos): a long prompt never holds (n, vocab) floats at once.
static void head_blocks(const Model& m, const float* normed, int64_t n, int64_t pos, const PositionLogits& each) {
  constexpr int64_t kHeadBlock = 32;
  const int64_t V = m.cfg.vocab_size, d = m.cfg.hidden_size;
  std::vector<float> block(static_cast<size_t>(std::min(n, kHeadBlock) * V));
  for (int64_t r = 0; r < n; r += kHeadBlock) {
    const int64_t nb = std::min(kHeadBlock, n - r);
    linear_forward_lowp(block.data(), normed + r * d, head_matrix(m, V), nb, false, RowKernel::per_row);
    each(pos + r, nb, block.data());
  }
}

std::vector<float> prefill(const Model& m, KVCache& cache, const std::vector<int32_t>& prompt, int64_t capacity,
                           const PositionLogits& each) {
  const auto& c = m.cfg;
  if (prompt.empty()) fail("empty prompt: give at least one token");
  if (capacity > c.max_position_embeddings) capacity = c.max_position_embeddings;
  const int64_t T = static_cast<int64_t>(prompt.size());
  if (T > capacity) fail("prompt of ", T, " tokens is longer than the context (", capacity, ")");
  JTOK_PROFILE("prefill (total)");
  Activations a;
  forward_hidden(m, a, prompt.data(), 1, T, ForwardMode::Inference);  // the head only for the last position, below
  const int64_t kvd = c.kv_dim();
  const size_t L = a.layers.size();
  kv_allocate(cache, L, kvd, capacity);
  cache.len = T;
  if (cache.bf16) {
    for (size_t l = 0; l < L; ++l) {
      quantize_bf16(cache.k16[l].data(), a.layers[l].k.data(), T * kvd);
      quantize_bf16(cache.v16[l].data(), a.layers[l].v.data(), T * kvd);
    }
  } else {
    for (size_t l = 0; l < L; ++l) {
      std::memcpy(cache.k[l].data(), a.layers[l].k.data(), sizeof(float) * T * kvd);
      std::memcpy(cache.v[l].data(), a.layers[l].v.data(), sizeof(float) * T * kvd);
    }
  }
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  linear_forward_lowp(logits.data(), a.lnf.data() + (T - 1) * c.hidden_size, head_matrix(m, c.vocab_size),
                      1);  // real rows only, as decode_step
  if (each) head_blocks(m, a.lnf.data(), T, 0, each);
  return logits;
}

void kv_allocate(KVCache& cache, size_t layers, int64_t kv_dim, int64_t capacity) {
  const size_t cap = static_cast<size_t>(capacity * kv_dim);
  cache.len = 0;
  cache.capacity = capacity;
  if (cache.bf16) {
    cache.k.clear();
    cache.v.clear();
    cache.k16.assign(layers, std::vector<uint16_t>(cap));
    cache.v16.assign(layers, std::vector<uint16_t>(cap));
  } else {
    cache.k16.clear();
    cache.v16.clear();
    cache.k.assign(layers, std::vector<float>(cap));
    cache.v.assign(layers, std::vector<float>(cap));
  }
}

std::vector<float> decode_step(const Model& m, KVCache& cache, int32_t token) {
  std::vector<float> logits(static_cast<size_t>(m.cfg.vocab_size));
  KVCache* c = &cache;
  decode_batch(m, &c, &token, 1, logits.data());
  return logits;
}

// The decode's attention step of layer l: every row's key and value k, v (M, kvd) into its cache first
// (a chunk's later rows read them), then row i's q (M, qd) attends over its cache's [0, pos[i]]:
// a row per thread, or one row's heads split among the threads (attention_decode, outside any
// parallel region, so its own can run). scratch: M * H * (tmax + 1).
static void attend_cached(float* att, const float* q, const float* k, const float* v, KVCache* const* caches,
                          const int64_t* pos, int64_t M, int64_t l, const ModelConfig& c, float* scratch, int64_t tmax) {
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), H = c.num_attention_heads, KV = c.num_key_value_heads, hd = c.hd();
#pragma omp parallel for schedule(static) if (M > 1)
  for (int64_t i = 0; i < M; ++i) {
    KVCache& kv = *caches[i];
    const int64_t t = pos[i];
    if (kv.bf16) {
      quantize_bf16(kv.k16[l].data() + t * kvd, k + i * kvd, kvd);
      quantize_bf16(kv.v16[l].data() + t * kvd, v + i * kvd, kvd);
    } else {
      std::memcpy(kv.k[l].data() + t * kvd, k + i * kvd, sizeof(float) * kvd);
      std::memcpy(kv.v[l].data() + t * kvd, v + i * kvd, sizeof(float) * kvd);
    }
  }
  auto attend = [&](int64_t i) {
    const KVCache& kv = *caches[i];
    float* sc = scratch + i * H * (tmax + 1);
    if (kv.bf16)
      attention_decode_bf16(att + i * qd, q + i * qd, kv.k16[l].data(), kv.v16[l].data(), pos[i], H, KV, hd, sc);
    else
      attention_decode(att + i * qd, q + i * qd, kv.k[l].data(), kv.v[l].data(), pos[i], H, KV, hd, sc);
  };
  if (M == 1) {
    attend(0);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M; ++i) attend(i);
  }
}

// Rows i = 0..M-1: token tokens[i] at position pos[i] of *caches[i] (a cache may appear in several
// rows, at distinct positions: a prompt chunk). Each layer writes every row's K/V first, then row i
// attends over its cache's [0, pos[i]]. logits (n_head, vocab) gets the rows head_rows[0..n_head).
// rk: per_row when the rows are distinct sequences (a decode step: each row's bits then do not depend
// on the others), fastest for one sequence's prompt chunk. Returns the token-table rows read.
static int64_t forward_rows(const Model& m, KVCache* const* caches, const int64_t* pos, const int32_t* tokens, int64_t M,
                            const int64_t* head_rows, int64_t n_head, float* logits, RowKernel rk,
                            const PositionLogits* each = nullptr) {
  const auto& c = m.cfg;
  int64_t rows_read = 0;
  int64_t tmax = 0;
  for (int64_t i = 0; i < M; ++i) {
    if (pos[i] >= caches[i]->capacity) fail("context full: ", caches[i]->capacity, " tokens");
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size) fail("token id ", tokens[i], " outside the vocabulary");
    tmax = std::max(tmax, pos[i]);
  }
  const int64_t d = c.hidden_size, F = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t H = c.num_attention_heads;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const size_t Md = static_cast<size_t>(M * d);
  std::vector<float> h(Md), x(Md), q(static_cast<size_t>(M * qd)), att(q.size()), kn(static_cast<size_t>(M * kvd)),
      vn(kn.size()), gate(static_cast<size_t>(M * F)), up(gate.size()), act(gate.size()), rstd(static_cast<size_t>(M)),
      scratch(static_cast<size_t>(M * H * (tmax + 1)));
  embed_rows(m, h.data(), tokens, M);
  JTokActs jt;      // JTok layers: the step's gathered rows and ungated MLP update
  JTokMActs jm;     // JTok-M layers: the step's routing
  QkNormActs qk;    // qk_norm: scratch (the decode step has no backward)
  MoeActs ma;       // MoE layers (their aux loss is unused here)
  RowBatch rb;
  if (c.jtok || c.jtokm) rb = dedup_ids(tokens, M, c.padded_vocab());
  // The layer block runs in place on h (h_in = h_mid = h_out; x serves both norms' outputs), every
  // product by rk's kernels, each row at its own position.
  std::vector<float> delta_r(c.jtokm ? Md : 0);
  const LayerBuffers buf{h.data(), h.data(), h.data(),   x.data(),   rstd.data(), q.data(), kn.data(),
                         vn.data(), att.data(), x.data(), rstd.data(), gate.data(), up.data(), act.data(),
                         &qk,      &jt,      &jm,      &ma,        c.jtokm ? delta_r.data() : nullptr};
  LayerKernels lk;
  lk.rows = rk;
  lk.pos = pos;
  for (size_t l = 0; l < m.w.layers.size(); ++l) {
    auto attend = [&](float* o, const float* qr, const float* kr, const float* vr) {
      attend_cached(o, qr, kr, vr, caches, pos, M, static_cast<int64_t>(l), c, scratch.data(), tmax);
    };
    layer_forward(m, static_cast<int64_t>(l), buf, rb, M, lk, attend);
    if (m.w.layers[l].jtokm_router) rows_read += static_cast<int64_t>(jm.slot_u.size());
    if (m.w.layers[l].jtok_scale) rows_read += static_cast<int64_t>(rb.unique.size());
  }
  check_table_reads(m.tables);  // a disk table's failed read ends this step, naming the file
  if (each && *each) {  // every row's logits (one sequence's consecutive positions: a prompt chunk)
    rmsnorm_forward(x.data(), rstd.data(), h.data(), m.w.norm, M, d, eps);
    head_blocks(m, x.data(), M, pos[0], *each);
  }
  // The final norm and LM head of the rows asked for only (a chunk needs its last row's).
  std::vector<float> hs(static_cast<size_t>(n_head * d));
  for (int64_t r = 0; r < n_head; ++r) std::memcpy(hs.data() + r * d, h.data() + head_rows[r] * d, sizeof(float) * d);
  rmsnorm_forward(x.data(), rstd.data(), hs.data(), m.w.norm, n_head, d, eps);
  linear_forward_lowp(logits, x.data(), head_matrix(m, c.vocab_size), n_head, false, rk);  // real rows only
  return rows_read;
}

int64_t decode_batch(const Model& m, KVCache* const* caches, const int32_t* tokens, int64_t M, float* logits) {
  if (M <= 0) return 0;
  std::vector<int64_t> pos(static_cast<size_t>(M)), head(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i) {
    pos[i] = caches[i]->len;
    head[i] = i;
    for (int64_t j = 0; j < i; ++j)
      if (caches[j] == caches[i]) fail("decode_batch: sequence ", i, " repeats the cache of sequence ", j);
  }
  const int64_t rows = forward_rows(m, caches, pos.data(), tokens, M, head.data(), M, logits, RowKernel::per_row);
  for (int64_t i = 0; i < M; ++i) caches[i]->len += 1;
  return rows;
}

std::vector<float> prefill_chunk(const Model& m, KVCache& cache, const int32_t* tokens, int64_t n, int64_t* rows_read,
                                 const PositionLogits& each) {
  if (n <= 0) fail("prefill_chunk: empty chunk");
  if (cache.len == 0 || cache.layers() == 0) fail("prefill_chunk: the cache holds no prompt yet (start with prefill)");
  if (cache.len + n > cache.capacity)
    fail("prompt chunk of ", n, " tokens at position ", cache.len, " is beyond the context (", cache.capacity, ")");
  JTOK_PROFILE("prefill chunk");
  std::vector<KVCache*> caches(static_cast<size_t>(n), &cache);
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[i] = cache.len + i;
  const int64_t last = n - 1;
  std::vector<float> logits(static_cast<size_t>(m.cfg.vocab_size));
  const int64_t rows = forward_rows(m, caches.data(), pos.data(), tokens, n, &last, 1, logits.data(), RowKernel::fastest,
                                   &each);
  if (rows_read) *rows_read = rows;
  cache.len += n;
  return logits;
}

std::vector<float> prefill_chunked(const Model& m, KVCache& cache, const std::vector<int32_t>& prompt, int64_t capacity,
                                   int64_t chunk) {
  if (chunk < 1) fail("prefill chunk must be at least 1 token, got ", chunk);
  const int64_t P = static_cast<int64_t>(prompt.size());
  const int64_t first = std::min(P, chunk);
  std::vector<float> l = prefill(m, cache, {prompt.begin(), prompt.begin() + first}, capacity);
  for (int64_t at = first; at < P; at += chunk)
    l = prefill_chunk(m, cache, prompt.data() + at, std::min(chunk, P - at));
  return l;
}

int32_t sample_token(const std::vector<float>& logits, const SamplingParams& p, std::mt19937_64& rng) {
  return sample_token(logits.data(), static_cast<int64_t>(logits.size()), p, rng);
}

int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, std::mt19937_64& rng) {
  if (p.temperature <= 0) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  if (p.top_k <= 0 && p.top_p >= 1.0) {  // plain temperature sampling: no ordering needed
    const double mx = *std::max_element(logits, logits + V);
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
