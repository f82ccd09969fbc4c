#include "dist/sharded_tables.h"

#include <algorithm>
#include <bit>
#include <filesystem>
#include <optional>
#include <cstring>

#include "core/error.h"
#include "core/profile.h"
#include "dist/communicator.h"
#include "io/safetensors.h"
#include "model/jtokm_mix.h"
#include "ops/adamw.h"

namespace jtok::dist {

namespace {
// Numbers the distinct (id, table) pairs of the choices sel (N, K) of the positions ids (rows < V, tables
// < ne) in order of first use, leaving out the positions n with skip[n] set (skip nullptr: none):
// pair_ids / pair_tables get one entry a pair, slot (N, K) the pair of each choice (-1 where skipped).
void number_pairs(const int32_t* ids, const int32_t* sel, int64_t N, int64_t K, int64_t V, int64_t ne, const char* skip,
                  std::vector<int32_t>& pair_ids, std::vector<int32_t>& pair_tables, std::vector<int32_t>& slot) {
  pair_ids.clear();
  pair_tables.clear();
  slot.assign(static_cast<size_t>(N * K), -1);
  std::vector<int32_t> first(static_cast<size_t>(V * ne), -1);  // (V, ne): pair of (id, table), or -1
  for (int64_t n = 0; n < N; ++n) {
    if (skip && skip[n]) continue;
    for (int64_t k = 0; k < K; ++k) {
      int32_t& q = first[static_cast<size_t>(ids[n] * ne + sel[n * K + k])];
      if (q < 0) {
        q = static_cast<int32_t>(pair_ids.size());
        pair_ids.push_back(ids[n]);
        pair_tables.push_back(sel[n * K + k]);
      }
      slot[static_cast<size_t>(n * K + k)] = q;
    }
  }
}
}  // namespace

ShardedTables::Mode ShardedTables::parse_mode(const std::string& s) {
  if (s == "premix") return Mode::kPremix;
  if (s == "naive") return Mode::kNaive;
  if (s == "premix-dedup") return Mode::kPremixDedup;
  fail("--embp '", s, "': expected off, premix, premix-dedup or naive");
}

RowOwner::Kind ShardedTables::parse_owner(const std::string& s) {
  if (s == "mod") return RowOwner::kModP;
  if (s == "contiguous") return RowOwner::kContiguous;
  fail("--embp-owner '", s, "': expected mod or contiguous");
}

ShardedTables::ShardedTables(Model& m, AdamWState& st, Mode mode, RowOwner::Kind owner, const uint64_t* init_seed,
                             const std::string* checkpoint_dir)
    : mode_(mode) {
  JTOK_CHECK(!(init_seed && checkpoint_dir), "ShardedTables: rows from a seed or from a checkpoint, not both");
  if (!init_seed && !checkpoint_dir) sync_tables(m, st);  // the rows taken must be current
  std::optional<StIndex> model_idx, opt_idx;
  if (checkpoint_dir) {
    model_idx = read_safetensors_index((std::filesystem::path(*checkpoint_dir) / "model.safetensors").string());
    opt_idx = read_safetensors_index((std::filesystem::path(*checkpoint_dir) / "optimizer.safetensors").string());
  }
  const int me = rank(), P = world_size();
  where_.assign(m.tables.size(), {-1, -1});
  auto add_shard = [&](int64_t first, int64_t n) {
    const int64_t V = m.tables[first].rows, d = m.tables[first].dim;
    TableShard s = make_shard(RowOwner{V, P, owner}, me, n, d);
    for (int64_t t = 0; t < n; ++t) {
      const size_t k = static_cast<size_t>(first + t);
      JTOK_CHECK(m.tables[k].rows == V && m.tables[k].numel() == V * d, "table ", m.table_names[k]);
      where_[k] = {static_cast<int>(shards_.size()), static_cast<int>(t)};
      whole_bytes_ += V * d * static_cast<int64_t>(sizeof(float));
      if (init_seed) {  // this rank's rows of the random init; moments zero (make_shard)
        JTOK_CHECK(st.table_m[k].empty(), "table ", m.table_names[k], ": init from the seed with moments present");
        const RowOwner& own = s.own;
        float* w = s.w[t].data();
        for_each_table_init_row(m, *init_seed, static_cast<int64_t>(k), [&](int64_t g, const float* v) {
          if (own.owner(g) == me) std::memcpy(w + own.local(g) * d, v, sizeof(float) * d);
        });
        continue;
      }
      if (checkpoint_dir) {  // this rank's rows of the values and both moments, 4096 rows a read
        JTOK_CHECK(st.table_m[k].empty(), "table ", m.table_names[k], ": read from the checkpoint with moments present");
        const std::string& name = m.table_names[k];
        const struct { const StIndex* idx; std::string tensor; float* dst; } parts[3] = {
            {&*model_idx, name, s.w[t].data()},
            {&*opt_idx, "exp_avg." + name, s.m[t].data()},
            {&*opt_idx, "exp_avg_sq." + name, s.v[t].data()}};
        const int64_t block = 4096;
        std::vector<float> buf(static_cast<size_t>(std::min(block, V) * d));
        for (const auto& part : parts) {
          auto it = part.idx->tensors.find(part.tensor);
          if (it == part.idx->tensors.end()) fail(part.idx->path, ": missing tensor ", part.tensor);
          if (it->second.dtype != "F32" || it->second.shape != std::vector<int64_t>{V, d})
            fail(part.idx->path, ": tensor ", part.tensor, " is not F32 of shape [", V, ", ", d, "]");
          for (int64_t lo = 0; lo < V; lo += block) {
            const int64_t hi = std::min(V, lo + block);
            read_tensor_range(*part.idx, part.tensor, static_cast<uint64_t>(lo * d) * sizeof(float),
                              static_cast<uint64_t>((hi - lo) * d) * sizeof(float), buf.data());
            for (int64_t g = lo; g < hi; ++g)
              if (s.own.owner(g) == me) std::memcpy(part.dst + s.own.local(g) * d, buf.data() + (g - lo) * d, sizeof(float) * d);
          }
        }
        continue;
      }
      const bool moments = static_cast<int64_t>(st.table_m[k].size()) == V * d;
      for (int64_t r = 0; r < s.rows; ++r) {
        const int64_t g = s.own.global(me, r);
        std::memcpy(s.w[t].data() + r * d, m.tables[k].row(g), sizeof(float) * d);
        if (moments) {
          std::memcpy(s.m[t].data() + r * d, st.table_m[k].data() + g * d, sizeof(float) * d);
          std::memcpy(s.v[t].data() + r * d, st.table_v[k].data() + g * d, sizeof(float) * d);
        }
      }
    }
    shards_.push_back(std::move(s));
  };
  for (int64_t l = 0; l < m.cfg.num_hidden_layers; ++l) {
    if (m.jtok_table[l] >= 0) jtok_tables_.push_back(m.jtok_table[l]);
    if (m.jtok_table[l] >= 0) add_shard(m.jtok_table[l], 1);
    if (m.jtokm_table[l] >= 0) add_shard(m.jtokm_table[l], m.cfg.jtokm_n_e);
  }
  for (const auto& w : where_) JTOK_CHECK(w.first >= 0, "a table belongs to no layer");
  premix_.resize(shards_.size());
  naive_.resize(shards_.size());
  posted_.resize(shards_.size());
  // Every row is current at the optimizer's step (sync_tables above, or a fresh or loaded state).
  consts_base_ = st.step;
  row_step_.resize(shards_.size());
  for (size_t s = 0; s < shards_.size(); ++s) {
    row_step_[s].assign(static_cast<size_t>(shards_[s].n_tables),
                        std::vector<int32_t>(static_cast<size_t>(shards_[s].rows), static_cast<int32_t>(st.step)));
    shards_[s].sync = [this, s](int64_t t, int64_t r) { catch_up(static_cast<int>(s), t, r, tables_step()); };
  }
  release(m, st);
}

void ShardedTables::release(Model& m, AdamWState& st) {
  for (size_t k = 0; k < m.tables.size(); ++k) {
    m.tables[k] = TokenTable::unbound(0, m.tables[k].dim);  // no rows here; the dim stays: the model reads it
    std::vector<float>().swap(st.table_m[k]);
    std::vector<float>().swap(st.table_v[k]);
    m.table_grads[k] = SparseRowGrad{};
    m.table_grads[k].dim = m.tables[k].dim;
  }
  mark_tables_current(m, st);
}

void ShardedTables::prefetch(const RowBatch& rb) {
  if (jtok_tables_.empty()) return;
  JTOK_PROFILE("embp_prefetch");
  JTOK_CHECK(!pre_ || pre_->done(), "a JTok row prefetch was posted before the previous one was used");
  const int P = world_size();
  const int64_t U = static_cast<int64_t>(rb.unique.size());
  const RowOwner& own = shards_[where_[static_cast<size_t>(jtok_tables_[0])].first].own;
  std::vector<std::vector<int32_t>> req(static_cast<size_t>(P));
  pre_where_.assign(static_cast<size_t>(P), {});
  for (int64_t u = 0; u < U; ++u) {
    const size_t o = static_cast<size_t>(own.owner(rb.unique[u]));
    req[o].push_back(rb.unique[u]);
    pre_where_[o].push_back(static_cast<int32_t>(u));
  }
  pre_ids_ = rb.unique;
  const int64_t d = shards_[where_[static_cast<size_t>(jtok_tables_[0])].first].dim;
  const int64_t nj = static_cast<int64_t>(jtok_tables_.size());
  // The owner's answer: per requested id, its row of every JTok table (brought current first).
  auto serve = [this, d, nj](int, const int32_t* ids, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < nj; ++k) {
        const auto [si, t] = where_[static_cast<size_t>(jtok_tables_[static_cast<size_t>(k)])];
        const TableShard& sh = shards_[si];
        JTOK_CHECK(ids[i] >= 0 && ids[i] < sh.own.V && sh.own.owner(ids[i]) == sh.rank, "rank ", sh.rank,
                   " asked for row ", ids[i], " it does not own");
        if (sh.sync) sh.sync(t, sh.own.local(ids[i]));
        std::memcpy(out + (i * nj + k) * d, sh.row(t, ids[i]), sizeof(float) * d);
      }
  };
  pre_ = std::make_unique<RequestReply>(std::move(req), 1, nj * d, serve);
}

void ShardedTables::poll() {
  if (pre_ && !pre_->done()) pre_->progress();
  for (Posted& p : posted_) {
    if (p.fwd && !p.fwd->done()) p.fwd->progress();
    if (p.bwd && !p.bwd->done()) p.bwd->progress();
  }
  progress_pushes();
}

// One-way pushes of gradient rows to their owners (reply_floats 0), served in order (RequestReply's
// ordered mode: source 0, 1, ...) and one push after the other (progress_pushes stops at the first
// not yet served), so each owner adds them in the order of the blocking path.
void ShardedTables::post_push(std::vector<std::vector<int32_t>> msg, int64_t item, int si, int64_t table, bool pairs) {
  const int64_t d = shards_[static_cast<size_t>(si)].dim;
  auto serve = [this, si, table, pairs, item, d](int, const int32_t* req, int64_t n, float*) {
    TableShard& sh = shards_[static_cast<size_t>(si)];
    for (int64_t i = 0; i < n; ++i) {
      const int32_t* r = req + i * item;
      const int32_t id = r[0];
      const int64_t t = pairs ? r[1] : table;
      JTOK_CHECK(id >= 0 && id < sh.own.V && sh.own.owner(id) == sh.rank, "rank ", sh.rank, " got a gradient for row ", id,
                 " it does not own");
      JTOK_CHECK(t >= 0 && t < sh.n_tables, "gradient push for table ", t);
      float* g = sh.grads[static_cast<size_t>(t)].row(static_cast<int32_t>(sh.own.local(id)));
      const int32_t* x = r + (pairs ? 2 : 1);
      for (int64_t j = 0; j < d; ++j) g[j] += std::bit_cast<float>(x[j]);
    }
  };
  pushes_.push_back(std::make_unique<RequestReply>(std::move(msg), item, 0, serve, /*ordered=*/true));
  push_shard_.push_back(si);
  progress_pushes();
}

void ShardedTables::progress_pushes() {
  for (auto& p : pushes_) {
    if (p->served()) continue;
    p->progress();
    if (!p->served()) return;  // the next pushes only after this one: the owners' order of sums
  }
}

void ShardedTables::finish_pushes() {
  if (pushes_.empty()) return;
  JTOK_PROFILE("embp_push_wait");
  for (auto& p : pushes_) {
    p->wait();
    bytes_.add({p->sent_bytes(), p->recv_bytes()});
  }
  pushes_.clear();
  push_shard_.clear();
}

// The owner's answers. Premix: per request (id, K tables, K weights), e = sum_k w_k E_{sel_k}[id] from
// its rows (e = 0; e += w_k row_k: the local path's order), and the request kept for the backward.
RequestReply::Serve ShardedTables::premix_serve(int si, int64_t K) {
  const int64_t words = 1 + 2 * K, d = shards_[static_cast<size_t>(si)].dim;
  return [this, si, K, words, d](int src, const int32_t* q, int64_t n, float* out) {
    TableShard& s = shards_[static_cast<size_t>(si)];
    posted_[static_cast<size_t>(si)].recv[static_cast<size_t>(src)].assign(q, q + n * words);  // for the backward
    for (int64_t i = 0; i < n; ++i) {
      const int32_t* r = q + i * words;
      const int32_t id = r[0];
      JTOK_CHECK(id >= 0 && id < s.own.V && s.own.owner(id) == s.rank, "rank ", s.rank, " asked for row ", id,
                 " it does not own");
      float* e = out + i * d;
      std::fill(e, e + d, 0.0f);
      for (int64_t k = 0; k < K; ++k) {
        const int32_t t = r[1 + k];
        JTOK_CHECK(t >= 0 && t < s.n_tables, "premix request for table ", t);
        const float wk = std::bit_cast<float>(r[1 + K + k]);
        if (s.sync) s.sync(t, s.own.local(id));
        const float* row = s.row(t, id);
        mix_term(e, wk, row, d);
      }
    }
  };
}

// Naive: per request (id, table), the raw row.
RequestReply::Serve ShardedTables::naive_serve(int si) {
  const int64_t d = shards_[static_cast<size_t>(si)].dim;
  return [this, si, d](int, const int32_t* q, int64_t n, float* out) {
    const TableShard& s = shards_[static_cast<size_t>(si)];
    for (int64_t i = 0; i < n; ++i) {
      const int32_t id = q[2 * i], t = q[2 * i + 1];
      JTOK_CHECK(id >= 0 && id < s.own.V && s.own.owner(id) == s.rank, "rank ", s.rank, " asked for row ", id,
                 " it does not own");
      JTOK_CHECK(t >= 0 && t < s.n_tables, "naive request for table ", t);
      if (s.sync) s.sync(t, s.own.local(id));
      std::memcpy(out + i * d, s.row(t, id), sizeof(float) * d);
    }
  };
}

void ShardedTables::mix_post(int64_t table_base, const int32_t* ids, const int32_t* sel, const float* w, int64_t N,
                             int64_t K) {
  if (overlap_) post_mix(table_base, ids, sel, w, N, K);
}

void ShardedTables::post_mix(int64_t table_base, const int32_t* ids, const int32_t* sel, const float* w, int64_t N,
                             int64_t K) {
  JTOK_PROFILE("embp_mix_post");
  const int si = where_[static_cast<size_t>(table_base)].first;
  const TableShard& sh = shards_[static_cast<size_t>(si)];
  Posted& pm = posted_[static_cast<size_t>(si)];
  JTOK_CHECK(!pm.fwd || pm.fwd->done(), "a JTok-M exchange was posted before the previous one was used");
  const size_t P = static_cast<size_t>(world_size());
  const int64_t d = sh.dim, ne = sh.n_tables;
  pm.N = N;
  pm.K = K;
  pm.where.assign(P, {});
  pm.where2.assign(P, {});
  pm.recv.assign(P, {});
  pm.bwd.reset();
  pm.fwd2.reset();
  // Which positions are premixed: every one (premix), none (naive), or (premix + dedup) those of
  // the ids for which premixing their positions moves fewer bytes than fetching their distinct
  // (id, table) rows (dist::premix_cheaper, the planner's rule), decided per id and micro-batch.
  std::vector<char> premixed(static_cast<size_t>(N), mode_ == Mode::kPremix ? 1 : 0);
  if (mode_ == Mode::kPremixDedup) {
    std::vector<int32_t> count(static_cast<size_t>(sh.own.V), 0), pairs(static_cast<size_t>(sh.own.V), 0);
    std::vector<int32_t> first(static_cast<size_t>(sh.own.V * ne), -1);  // (V, n_e): (id, table) seen
    for (int64_t n = 0; n < N; ++n) {
      ++count[static_cast<size_t>(ids[n])];
      for (int64_t k = 0; k < K; ++k) {
        int32_t& f = first[static_cast<size_t>(ids[n] * ne + sel[n * K + k])];
        if (f < 0) f = 0, ++pairs[static_cast<size_t>(ids[n])];
      }
    }
    for (int64_t n = 0; n < N; ++n)
      premixed[static_cast<size_t>(n)] =
          premix_cheaper(count[static_cast<size_t>(ids[n])], pairs[static_cast<size_t>(ids[n])], K, d) ? 1 : 0;
  }
  // Premixed positions: (id, the K tables, the K weights) to the id's owner.
  std::vector<std::vector<int32_t>> req(P);
  for (int64_t n = 0; n < N; ++n) {
    if (!premixed[static_cast<size_t>(n)]) continue;
    const size_t o = static_cast<size_t>(sh.own.owner(ids[n]));
    auto& r = req[o];
    r.push_back(ids[n]);
    for (int64_t k = 0; k < K; ++k) r.push_back(sel[n * K + k]);
    for (int64_t k = 0; k < K; ++k) r.push_back(std::bit_cast<int32_t>(w[n * K + k]));
    pm.where[o].push_back(static_cast<int32_t>(n));
  }
  if (mode_ != Mode::kNaive) pm.fwd = std::make_unique<RequestReply>(std::move(req), 1 + 2 * K, d, premix_serve(si, K));
  if (mode_ == Mode::kPremix) return;
  // The other positions: the unique (id, table) pairs, in order of first use; the owners return the
  // raw rows, mixed here.
  Naive& nv = naive_[static_cast<size_t>(si)];
  number_pairs(ids, sel, N, K, sh.own.V, ne, premixed.data(), nv.pair_ids, nv.pair_tables, nv.slot);
  nv.w.assign(w, w + N * K);
  std::vector<std::vector<int32_t>> rq(P);
  std::vector<std::vector<int32_t>>& where = mode_ == Mode::kNaive ? pm.where : pm.where2;
  for (size_t q = 0; q < nv.pair_ids.size(); ++q) {  // each owner's requests in order of first use
    const size_t o = static_cast<size_t>(sh.own.owner(nv.pair_ids[q]));
    rq[o].push_back(nv.pair_ids[q]);
    rq[o].push_back(nv.pair_tables[q]);
    where[o].push_back(static_cast<int32_t>(q));
  }
  auto rr = std::make_unique<RequestReply>(std::move(rq), 2, d, naive_serve(si));
  (mode_ == Mode::kNaive ? pm.fwd : pm.fwd2) = std::move(rr);
}

void ShardedTables::mix_backward_post(int64_t table_base, const float* de, int64_t N, int64_t K) {
  if (overlap_) post_mix_backward(table_base, de, N, K);
}

void ShardedTables::post_mix_backward(int64_t table_base, const float* de, int64_t N, int64_t K) {
  if (mode_ == Mode::kNaive) return;  // naive: dL/dw is local, its gradient push one-way (mix_backward)
  JTOK_PROFILE("embp_mix_bwd_post");
  const int si = where_[static_cast<size_t>(table_base)].first;
  const int64_t d = shards_[static_cast<size_t>(si)].dim;
  Posted& pm = posted_[static_cast<size_t>(si)];
  JTOK_CHECK(pm.fwd && pm.fwd->done() && pm.N == N && pm.K == K, "a JTok-M backward without its posted forward");
  // Premix + dedup: this shard's gradient pushes of earlier micro-batches are added first, so each
  // row's sum keeps the order of the posts (this exchange's serves add to the same rows).
  if (std::find(push_shard_.begin(), push_shard_.end(), si) != push_shard_.end()) finish_pushes();
  const size_t P = static_cast<size_t>(world_size());
  // dL/de (d per premixed position) to the owners, in the forward's request order.
  std::vector<std::vector<int32_t>> msg(P);
  for (size_t j = 0; j < P; ++j) {
    msg[j].resize(pm.where[j].size() * static_cast<size_t>(d));
    for (size_t i = 0; i < pm.where[j].size(); ++i)
      std::memcpy(msg[j].data() + i * static_cast<size_t>(d), de + static_cast<int64_t>(pm.where[j][i]) * d, sizeof(float) * d);
  }
  // Owner: per request, dL/dw_k = de . row_k and row_k's gradient += w_k de (sources in rank order:
  // the blocking premix_backward's order of sums).
  const int64_t words = 1 + 2 * K;
  auto serve = [this, si, K, words, d](int src, const int32_t* q, int64_t n, float* out) {
    TableShard& s = shards_[static_cast<size_t>(si)];
    const std::vector<int32_t>& fw = posted_[static_cast<size_t>(si)].recv[static_cast<size_t>(src)];
    JTOK_CHECK(static_cast<int64_t>(fw.size()) == n * words, "premix backward: rank ", src, " sent ", n,
               " gradients for ", fw.size() / static_cast<size_t>(words), " forward requests");
    for (int64_t i = 0; i < n; ++i) {
      const int32_t* r = fw.data() + i * words;
      const int32_t id = r[0];
      const float* g = reinterpret_cast<const float*>(q + i * d);
      for (int64_t k = 0; k < K; ++k) {
        const int32_t t = r[1 + k];
        const float wk = std::bit_cast<float>(r[1 + K + k]);
        const float* row = s.row(t, id);
        const float acc = mix_term_dw(g, row, d);
        out[i * K + k] = acc;
        float* gr = s.grads[static_cast<size_t>(t)].row(static_cast<int32_t>(s.own.local(id)));
        mix_term_grad(gr, wk, g, d);
      }
    }
  };
  pm.bwd = std::make_unique<RequestReply>(std::move(msg), d, K, serve, /*ordered=*/true);
}

void ShardedTables::rows(float* out, int64_t table, const RowBatch& rb) {
  JTOK_PROFILE("embp_rows");
  const auto [s, t] = where_[static_cast<size_t>(table)];
  if (!pre_) {
    bytes_.add(fetch_rows(out, shards_[s], t, rb));
    return;
  }
  JTOK_CHECK(rb.unique == pre_ids_, "JTok rows asked for other ids than the forward's prefetch");
  if (!pre_->done()) {
    pre_->wait();
    bytes_.add({pre_->sent_bytes(), pre_->recv_bytes()});
  }
  const int64_t d = shards_[s].dim, nj = static_cast<int64_t>(jtok_tables_.size());
  const int64_t k = std::find(jtok_tables_.begin(), jtok_tables_.end(), table) - jtok_tables_.begin();
  JTOK_CHECK(k < nj, "table ", table, " is not a JTok table");
  for (size_t j = 0; j < pre_where_.size(); ++j) {
    const std::vector<float>& rep = pre_->reply(static_cast<int>(j));
    for (size_t i = 0; i < pre_where_[j].size(); ++i)
      std::memcpy(out + static_cast<int64_t>(pre_where_[j][i]) * d, rep.data() + (static_cast<int64_t>(i) * nj + k) * d,
                  sizeof(float) * d);
  }
}

void ShardedTables::row_grads(int64_t table, SparseRowGrad& g) {
  JTOK_PROFILE("embp_row_grads");
  const auto [s, t] = where_[static_cast<size_t>(table)];
  if (overlap_) {  // id + gradient row to the owner; the owner adds it when it arrives
    const TableShard& sh = shards_[static_cast<size_t>(s)];
    const int64_t d = sh.dim;
    std::vector<std::vector<int32_t>> msg(static_cast<size_t>(world_size()));
    for (size_t u = 0; u < g.ids.size(); ++u) {
      auto& m = msg[static_cast<size_t>(sh.own.owner(g.ids[u]))];
      m.push_back(g.ids[u]);
      const size_t at = m.size();
      m.resize(at + static_cast<size_t>(d));
      std::memcpy(m.data() + at, g.rows.data() + u * static_cast<size_t>(d), sizeof(float) * d);
    }
    post_push(std::move(msg), 1 + d, s, t, /*pairs=*/false);
  } else {
    bytes_.add(push_row_grads(shards_[s], t, g.ids, g.rows.data()));
  }
  g.clear();
}

void ShardedTables::mix(float* e, int64_t table_base, const int32_t* ids, const int32_t* sel, const float* w, int64_t N,
                        int64_t K) {
  JTOK_PROFILE("embp_mix");
  const int s = where_[static_cast<size_t>(table_base)].first;
  const TableShard& sh = shards_[s];
  const int64_t d = sh.dim;
  if (!overlap_ && mode_ != Mode::kPremixDedup) {  // the blocking exchanges (embedding_parallel.h)
    if (mode_ == Mode::kPremix) {
      bytes_.add(premix_forward(e, premix_[s], sh, ids, sel, w, N, K));
      return;
    }
    Naive& nv = naive_[s];
    number_pairs(ids, sel, N, K, sh.own.V, sh.n_tables, nullptr, nv.pair_ids, nv.pair_tables, nv.slot);
    nv.w.assign(w, w + N * K);
    nv.rows.resize(nv.pair_ids.size() * static_cast<size_t>(d));
    bytes_.add(naive_fetch(nv.rows.data(), sh, nv.pair_ids, nv.pair_tables));
  } else {  // complete the exchanges mix_post started (post them now if it did not)
    Posted& pm = posted_[static_cast<size_t>(s)];
    if (!pm.fwd || pm.fwd->done()) post_mix(table_base, ids, sel, w, N, K);
    JTOK_CHECK(pm.N == N && pm.K == K, "JTok-M mix of ", N, " x ", K, " after a post of ", pm.N, " x ", pm.K);
    RequestReply* premix = mode_ == Mode::kNaive ? nullptr : pm.fwd.get();
    RequestReply* rows = mode_ == Mode::kNaive ? pm.fwd.get() : pm.fwd2.get();
    const auto& row_where = mode_ == Mode::kNaive ? pm.where : pm.where2;
    {
      JTOK_PROFILE("embp_mix_wait");
      for (RequestReply* rr : {premix, rows})
        if (rr) {
          rr->wait();
          bytes_.add({rr->sent_bytes(), rr->recv_bytes()});
        }
    }
    if (premix)
      for (size_t j = 0; j < pm.where.size(); ++j) {
        const std::vector<float>& rep = premix->reply(static_cast<int>(j));
        for (size_t i = 0; i < pm.where[j].size(); ++i)
          std::memcpy(e + static_cast<int64_t>(pm.where[j][i]) * d, rep.data() + i * static_cast<size_t>(d), sizeof(float) * d);
      }
    if (!rows) return;
    Naive& nv = naive_[s];
    nv.rows.resize(nv.pair_ids.size() * static_cast<size_t>(d));
    for (size_t j = 0; j < row_where.size(); ++j) {
      const std::vector<float>& rep = rows->reply(static_cast<int>(j));
      for (size_t i = 0; i < row_where[j].size(); ++i)
        std::memcpy(nv.rows.data() + static_cast<int64_t>(row_where[j][i]) * d, rep.data() + i * static_cast<size_t>(d),
                    sizeof(float) * d);
    }
  }
  // The fetched rows mixed here, as the local path mixes: e = 0; e += w_k row_k, k in order.
  const Naive& nv = naive_[s];
  for (int64_t n = 0; n < N; ++n) {
    if (nv.slot[static_cast<size_t>(n * K)] < 0) continue;  // premixed by the owner
    float* en = e + n * d;
    std::fill(en, en + d, 0.0f);
    for (int64_t k = 0; k < K; ++k) {
      const float wk = w[n * K + k];
      const float* r = nv.rows.data() + static_cast<int64_t>(nv.slot[n * K + k]) * d;
      mix_term(en, wk, r, d);
    }
  }
}

void ShardedTables::mix_backward(float* dw, int64_t table_base, const float* de, int64_t N, int64_t K) {
  JTOK_PROFILE("embp_mix_bwd");
  const int s = where_[static_cast<size_t>(table_base)].first;
  TableShard& sh = shards_[s];
  const bool posted = overlap_ || mode_ == Mode::kPremixDedup;
  if (mode_ == Mode::kPremix && !posted) {
    bytes_.add(premix_backward(dw, sh, premix_[s], de));
    return;
  }
  if (mode_ != Mode::kNaive) {  // complete the exchange mix_backward_post started (post it now if it did not)
    Posted& pm = posted_[static_cast<size_t>(s)];
    if (!pm.bwd) post_mix_backward(table_base, de, N, K);
    {
      JTOK_PROFILE("embp_mix_bwd_wait");
      pm.bwd->wait();
    }
    bytes_.add({pm.bwd->sent_bytes(), pm.bwd->recv_bytes()});
    for (size_t j = 0; j < pm.where.size(); ++j) {
      const std::vector<float>& rep = pm.bwd->reply(static_cast<int>(j));
      for (size_t i = 0; i < pm.where[j].size(); ++i)
        std::memcpy(dw + static_cast<int64_t>(pm.where[j][i]) * K, rep.data() + i * static_cast<size_t>(K), sizeof(float) * K);
    }
    pm.bwd.reset();
    for (auto& r : pm.recv) std::vector<int32_t>().swap(r);
    if (mode_ == Mode::kPremix) return;
  }
  // Fetched rows (naive, and premix + dedup's other ids): dL/dw here, and each pair's gradient row
  // (w_k de summed over its positions) to the owner.
  Naive& nv = naive_[s];
  const int64_t d = sh.dim, S = static_cast<int64_t>(nv.pair_ids.size());
  std::vector<float> grows(static_cast<size_t>(S * d), 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    if (nv.slot[static_cast<size_t>(n * K)] < 0) continue;  // premixed: dL/dw came from the owner
    const float* g = de + n * d;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t q = nv.slot[static_cast<size_t>(n * K + k)];
      const float* r = nv.rows.data() + q * d;
      const float acc = mix_term_dw(g, r, d);
      dw[n * K + k] = acc;
      const float wk = nv.w[static_cast<size_t>(n * K + k)];
      float* out = grows.data() + q * d;
      mix_term_grad(out, wk, g, d);
    }
  }
  if (!posted) {
    bytes_.add(push_pair_grads(sh, nv.pair_ids, nv.pair_tables, grows.data()));
    return;
  }
  // (id, table) + gradient row to the owner, pushed without waiting.
  std::vector<std::vector<int32_t>> msg(static_cast<size_t>(world_size()));
  for (int64_t q = 0; q < S; ++q) {
    auto& m = msg[static_cast<size_t>(sh.own.owner(nv.pair_ids[static_cast<size_t>(q)]))];
    m.push_back(nv.pair_ids[static_cast<size_t>(q)]);
    m.push_back(nv.pair_tables[static_cast<size_t>(q)]);
    const size_t at = m.size();
    m.resize(at + static_cast<size_t>(d));
    std::memcpy(m.data() + at, grows.data() + q * d, sizeof(float) * d);
  }
  post_push(std::move(msg), 2 + d, s, 0, /*pairs=*/true);
  if (!overlap_) finish_pushes();  // blocking: complete where the model asks
}

void ShardedTables::clear_grads() {
  finish_pushes();
  for (auto& s : shards_)
    for (auto& g : s.grads) g.clear();
}

double ShardedTables::grad_sum_squares() {
  finish_pushes();
  double ss = 0;
  for (const auto& s : shards_)
    for (const auto& g : s.grads) ss += g.sum_squares();
  allreduce_sum(&ss, 1);
  return ss;
}

// As train/optimizer.cpp's replay_row: the zero-gradient steps row r missed, one by one with each
// step's constants (a row with zero moments only decays), so it ends bit for bit where the eager
// pass would have put it.
void ShardedTables::catch_up(int si, int64_t t, int64_t r, int64_t to) {
  int32_t& have = row_step_[si][t][r];
  if (have >= to || consts_.empty()) return;
  TableShard& s = shards_[si];
  const int64_t d = s.dim;
  float* p = s.w[t].data() + r * d;
  float* m = s.m[t].data() + r * d;
  float* v = s.v[t].data() + r * d;
  bool cold = true;
  for (int64_t i = 0; i < d; ++i) cold = cold && m[i] == 0.0f && v[i] == 0.0f;
  JTOK_CHECK(have >= consts_base_, "shard row ", r, " is at step ", have, " but the kept steps start after ", consts_base_);
  for (int64_t k = have + 1; k <= to; ++k) {
    const AdamWStepConsts& c = consts_[static_cast<size_t>(k - consts_base_ - 1)];
    if (cold) {
      const float decay = c.decay;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) p[i] *= decay;
    } else {
      adamw_elements(p, nullptr, m, v, d, c);
    }
  }
  have = static_cast<int32_t>(to);
}

void ShardedTables::sync_all() {
  const int64_t to = tables_step();
  if (!consts_.empty())
    for (size_t s = 0; s < shards_.size(); ++s)
      for (int64_t t = 0; t < shards_[s].n_tables; ++t)
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < shards_[s].rows; ++r) catch_up(static_cast<int>(s), t, r, to);
  consts_.clear();
  consts_base_ = to;
}

void ShardedTables::optimizer_step(const TrainConfig& t, const StepStats& st, int64_t step) {
  JTOK_PROFILE("embp_optimizer");
  finish_pushes();
  const AdamWStepConsts c = adamw_consts(table_adamw_hyper(t, st, step));
  const bool dense = t.table_optimizer != "sparse";
  if (dense) {
    JTOK_CHECK(tables_step() == step - 1, "shard table optimizer out of step: ", tables_step(), " vs ", step - 1);
    consts_.push_back(c);
  } else {
    JTOK_CHECK(consts_.empty(), "sparse table optimizer with deferred dense steps pending");
    consts_base_ = step;
  }
  for (size_t si = 0; si < shards_.size(); ++si) {
    TableShard& s = shards_[si];
    const int64_t d = s.dim;
    for (int64_t k = 0; k < s.n_tables; ++k) {
      const SparseRowGrad& g = s.grads[k];
      float *w = s.w[k].data(), *m = s.m[k].data(), *v = s.v[k].data();
      const int64_t R = static_cast<int64_t>(g.ids.size());
      // Rows with a gradient: (dense) catch up on the steps they missed, then this step's update.
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < R; ++i) {
        const int64_t r = g.ids[static_cast<size_t>(i)];
        if (dense) catch_up(static_cast<int>(si), k, r, step - 1);
        adamw_elements(w + r * d, g.rows.data() + i * d, m + r * d, v + r * d, d, c);
        row_step_[si][k][static_cast<size_t>(r)] = static_cast<int32_t>(step);
      }
    }
  }
}

void ShardedTables::gather_to_root(Model& m, AdamWState& st) {
  JTOK_PROFILE("embp_gather_to_root");
  finish_pushes();
  sync_all();  // the rows written must be current
  const int me = rank(), P = world_size();
  for (size_t k = 0; k < m.tables.size(); ++k) {
    const auto [si, t] = where_[k];
    const TableShard& s = shards_[si];
    const int64_t d = s.dim, V = s.own.V, n = s.rows * d;
    // w, m, v of my rows, to rank 0 only.
    std::vector<float> mine(static_cast<size_t>(3 * n));
    std::memcpy(mine.data(), s.w[t].data(), sizeof(float) * n);
    std::memcpy(mine.data() + n, s.m[t].data(), sizeof(float) * n);
    std::memcpy(mine.data() + 2 * n, s.v[t].data(), sizeof(float) * n);
    std::vector<int64_t> sc(static_cast<size_t>(P), 0), so(static_cast<size_t>(P), 0), rc(static_cast<size_t>(P), 0);
    sc[0] = 3 * n * static_cast<int64_t>(sizeof(float));
    if (me == 0)
      for (int r = 0; r < P; ++r) rc[static_cast<size_t>(r)] = 3 * s.own.rows_on(r) * d * static_cast<int64_t>(sizeof(float));
    const std::vector<int64_t> ro = prefix_offsets(rc);
    std::vector<float> all(static_cast<size_t>((ro.back() + rc.back()) / static_cast<int64_t>(sizeof(float))));
    alltoallv(mine.data(), sc, so, all.data(), rc, ro);
    if (me != 0) continue;
    m.tables[k] = TokenTable::in_ram(V, d);
    st.table_m[k].assign(static_cast<size_t>(V * d), 0.0f);
    st.table_v[k].assign(static_cast<size_t>(V * d), 0.0f);
    for (int r = 0; r < P; ++r) {
      const int64_t rows = s.own.rows_on(r);
      const float* base = all.data() + ro[static_cast<size_t>(r)] / static_cast<int64_t>(sizeof(float));
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t g = s.own.global(r, i);
        std::memcpy(m.tables[k].mutable_row(g), base + i * d, sizeof(float) * d);
        std::memcpy(st.table_m[k].data() + g * d, base + rows * d + i * d, sizeof(float) * d);
        std::memcpy(st.table_v[k].data() + g * d, base + 2 * rows * d + i * d, sizeof(float) * d);
      }
    }
  }
  if (me == 0) mark_tables_current(m, st);
}

std::vector<TableRows> ShardedTables::owned_rows() {
  finish_pushes();
  sync_all();  // the rows written must be current
  std::vector<TableRows> out(where_.size());
  for (size_t k = 0; k < where_.size(); ++k) {
    const auto [si, t] = where_[k];
    const TableShard& s = shards_[static_cast<size_t>(si)];
    TableRows& o = out[k];
    o.V = s.own.V;
    o.dim = s.dim;
    o.rows = s.rows;
    o.global = [own = s.own, r = s.rank](int64_t local) { return own.global(r, local); };
    o.w = s.w[static_cast<size_t>(t)].data();
    o.m = s.m[static_cast<size_t>(t)].data();
    o.v = s.v[static_cast<size_t>(t)].data();
  }
  return out;
}

ExchangeBytes2 ShardedTables::take_bytes() {
  finish_pushes();  // their bytes belong to this step
  const ExchangeBytes2 b = bytes_;
  bytes_ = {};
  return b;
}

int64_t ShardedTables::table_bytes() const {
  int64_t b = 0;
  for (const auto& s : shards_) b += s.table_bytes();
  return b;
}

int64_t ShardedTables::moment_bytes() const {
  int64_t b = 0;
  for (const auto& s : shards_) b += s.moment_bytes();
  return b;
}

}  // namespace jtok::dist
