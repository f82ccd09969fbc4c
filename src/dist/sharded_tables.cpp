#include "dist/sharded_tables.h"

#include <algorithm>
#include <bit>
#include <filesystem>
#include <optional>
#include <cstring>

#include "core/error.h"
#include "core/profile.h"
#include "dist/communicator.h"
#include "dist/shard_io.h"
#include "io/safetensors.h"
#include "model/jtokm_mix.h"

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

ShardedTables::ShardedTables(Model& m, Mode mode, RowOwner::Kind owner, const uint64_t* init_seed,
                             const std::string* checkpoint_dir)
    : mode_(mode) {
  JTOK_CHECK(!(init_seed && checkpoint_dir), "ShardedTables: rows from a seed or from a checkpoint, not both");
  std::optional<StIndex> model_idx;
  if (checkpoint_dir)
    model_idx = read_safetensors_index((std::filesystem::path(*checkpoint_dir) / "model.safetensors").string());
  const int me = rank(), P = world_size();
  where_.assign(m.tables.size(), {-1, -1});
  auto add_shard = [&](int64_t first, int64_t n) {
    const int64_t V = m.tables[first].rows, d = m.tables[first].dim;
    TableShard s = make_shard(RowOwner{V, P, owner}, me, n, d);
    const std::vector<int32_t> ids = owned_ids(s.own, me);
    std::vector<float> rows(static_cast<size_t>(s.rows * d));
    for (int64_t t = 0; t < n; ++t) {
      const size_t k = static_cast<size_t>(first + t);
      JTOK_CHECK(m.tables[k].rows == V && m.tables[k].dim == d, "table ", m.table_names[k]);
      where_[k] = {static_cast<int>(shards_.size()), static_cast<int>(t)};
      whole_bytes_ += V * d * static_cast<int64_t>(sizeof(float));
      if (init_seed)  // this rank's rows of the random init
        for_each_table_init_row(m, *init_seed, static_cast<int64_t>(k), [&](int64_t g, const float* v) {
          if (s.tables[t].holds(g)) std::memcpy(rows.data() + s.tables[t].row_of(g) * d, v, sizeof(float) * d);
        });
      else if (checkpoint_dir)  // this rank's rows, 4096 rows a read
        read_owned_rows(*model_idx, m.table_names[k], s.tables[t], rows.data());
      else
        gather_rows(rows.data(), m.tables[k], ids.data(), s.rows);
      scatter_rows(s.tables[t], ids.data(), rows.data(), s.rows);
    }
    shards_.push_back(std::move(s));
  };
  for (int64_t l = 0; l < m.cfg.num_hidden_layers; ++l) {
    if (m.jtok_table[l] >= 0) jtok_tables_.push_back(m.jtok_table[l]);
    if (m.jtok_table[l] >= 0) add_shard(m.jtok_table[l], 1);
    if (m.jtokm_table[l] >= 0) add_shard(m.jtokm_table[l], m.cfg.jtokm_n_e);
  }
  for (const auto& w : where_) JTOK_CHECK(w.first >= 0, "a table belongs to no layer");
  naive_.resize(shards_.size());
  posted_.resize(shards_.size());
  release(m);
}

void ShardedTables::release(Model& m) {
  for (size_t k = 0; k < m.tables.size(); ++k) {
    m.tables[k] = TokenTable::unbound(0, m.tables[k].dim);  // no rows here; the dim stays: the model reads it
    m.table_grads[k] = SparseRowGrad{};
    m.table_grads[k].dim = m.tables[k].dim;
  }
}

void ShardedTables::prefetch(const RowBatch& rb) {
  if (jtok_tables_.empty()) return;
  JTOK_PROFILE("embp_prefetch");
  JTOK_CHECK(!pre_ || pre_->done(), "a JTok row prefetch was posted before the previous one was used");
  const int64_t U = static_cast<int64_t>(rb.unique.size());
  const RowOwner& own = shards_[where_[static_cast<size_t>(jtok_tables_[0])].first].own;
  OwnerRequests routed = route_to_owners(own, rb.unique.data(), nullptr, static_cast<size_t>(U));
  std::vector<std::vector<int32_t>>& req = routed.req;
  pre_where_ = std::move(routed.where);
  pre_ids_ = rb.unique;
  const int64_t d = shards_[where_[static_cast<size_t>(jtok_tables_[0])].first].dim;
  const int64_t nj = static_cast<int64_t>(jtok_tables_.size());
  // The owner's answer: per requested id, its row of every JTok table (the id's nj rows together).
  auto serve = [this, d, nj](int, const int32_t* ids, int64_t n, float* out) {
    std::vector<float> rows(static_cast<size_t>(n * d));
    for (int64_t k = 0; k < nj; ++k) {
      const auto [si, t] = where_[static_cast<size_t>(jtok_tables_[static_cast<size_t>(k)])];
      serve_rows(shards_[static_cast<size_t>(si)], t, ids, n, rows.data());
      for (int64_t i = 0; i < n; ++i) std::memcpy(out + (i * nj + k) * d, rows.data() + i * d, sizeof(float) * d);
    }
  };
  pre_ = std::make_unique<RequestReply>(std::move(req), 1, nj * d, serve);
}

void ShardedTables::poll() {
  if (pre_ && !pre_->done()) pre_->progress();
  for (Posted& p : posted_)
    for (RequestReply* rr : {p.premix_fwd.get(), p.pairs_fwd.get(), p.premix_bwd.get()})
      if (rr && !rr->done()) rr->progress();
  progress_pushes();
}

// One-way pushes of gradient rows to their owners (reply_floats 0), served in order (RequestReply's
// ordered mode: source 0, 1, ...) and one push after the other (progress_pushes stops at the first
// not yet served), so each owner adds them in the order of the blocking path.
void ShardedTables::post_push(std::vector<std::vector<int32_t>> msg, int si, int64_t table, bool pairs) {
  const int64_t item = (pairs ? 2 : 1) + shards_[static_cast<size_t>(si)].dim;
  auto serve = [this, si, table, pairs](int, const int32_t* req, int64_t n, float*) {
    add_pushed_grads(shards_[static_cast<size_t>(si)], req, n, pairs, table);
  };
  pushes_.push_back(std::make_unique<RequestReply>(std::move(msg), item, 0, serve, /*ordered=*/true));
  push_shard_.push_back(si);
  progress_pushes();
  if (!overlap_) finish_grads();  // blocking: complete where the model asks
}

void ShardedTables::progress_pushes() {
  for (auto& p : pushes_) {
    if (p->served()) continue;
    p->progress();
    if (!p->served()) return;  // the next pushes only after this one: the owners' order of sums
  }
}

void ShardedTables::finish_grads() {
  if (pushes_.empty()) return;
  JTOK_PROFILE("embp_push_wait");
  for (auto& p : pushes_) {
    p->wait();
    bytes_.add({p->sent_bytes(), p->recv_bytes()});
  }
  pushes_.clear();
  push_shard_.clear();
}

void ShardedTables::mix_post(int64_t table_base, const int32_t* ids, const int32_t* sel, const float* w, int64_t N,
                             int64_t K) {
  if (overlap_) post_mix(table_base, ids, sel, w, N, K);
}

// Which positions are premixed: every one (premix), none (naive), or (premix + dedup) those of the
// ids for which premixing their positions moves fewer bytes than fetching their distinct (id,
// table) rows (dist::premix_cheaper, the planner's rule), decided per id and micro-batch.
std::vector<char> ShardedTables::premixed_positions(const TableShard& sh, const int32_t* ids, const int32_t* sel,
                                                    int64_t N, int64_t K) const {
  std::vector<char> premixed(static_cast<size_t>(N), mode_ == Mode::kPremix ? 1 : 0);
  if (mode_ != Mode::kPremixDedup) return premixed;
  const int64_t ne = sh.n_tables;
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
        premix_cheaper(count[static_cast<size_t>(ids[n])], pairs[static_cast<size_t>(ids[n])], K, sh.dim) ? 1 : 0;
  return premixed;
}

void ShardedTables::post_mix(int64_t table_base, const int32_t* ids, const int32_t* sel, const float* w, int64_t N,
                             int64_t K) {
  JTOK_PROFILE("embp_mix_post");
  const int si = where_[static_cast<size_t>(table_base)].first;
  TableShard& sh = shards_[static_cast<size_t>(si)];
  Posted& pm = posted_[static_cast<size_t>(si)];
  JTOK_CHECK((!pm.premix_fwd || pm.premix_fwd->done()) && (!pm.pairs_fwd || pm.pairs_fwd->done()),
             "a JTok-M exchange was posted before the previous one was used");
  const std::vector<char> premixed = premixed_positions(sh, ids, sel, N, K);
  pm.premix_bwd.reset();
  pm.pairs_fwd.reset();
  // Premixed positions: (id, the K tables, the K weights) to the id's owner.
  std::vector<std::vector<int32_t>> req = premix_requests(pm.premix, sh.own, ids, sel, w, N, K, premixed.data());
  pm.premix_fwd.reset();
  if (mode_ != Mode::kNaive)
    pm.premix_fwd = std::make_unique<RequestReply>(std::move(req), 1 + 2 * K, sh.dim, premix_serve(sh, pm.premix));
  if (mode_ == Mode::kPremix) return;
  // The other positions: the unique (id, table) pairs, in order of first use; the owners return the
  // raw rows, mixed here.
  Naive& nv = naive_[static_cast<size_t>(si)];
  number_pairs(ids, sel, N, K, sh.own.V, sh.n_tables, premixed.data(), nv.pair_ids, nv.pair_tables, nv.slot);
  nv.w.assign(w, w + N * K);
  // each owner's requests in order of first use
  OwnerRequests rq = route_to_owners(sh.own, nv.pair_ids.data(), nv.pair_tables.data(), nv.pair_ids.size());
  pm.pair_where = std::move(rq.where);
  pm.pairs_fwd = std::make_unique<RequestReply>(std::move(rq.req), 2, sh.dim, [&sh](int, const int32_t* q, int64_t n, float* o) {
    serve_pairs(sh, q, n, o);
  });
}

void ShardedTables::mix_backward_post(int64_t table_base, const float* de, int64_t N, int64_t K) {
  if (overlap_) post_mix_backward(table_base, de, N, K);
}

void ShardedTables::post_mix_backward(int64_t table_base, const float* de, int64_t N, int64_t K) {
  if (mode_ == Mode::kNaive) return;  // naive: dL/dw is local, its gradient push one-way (mix_backward)
  JTOK_PROFILE("embp_mix_bwd_post");
  const int si = where_[static_cast<size_t>(table_base)].first;
  TableShard& sh = shards_[static_cast<size_t>(si)];
  const int64_t d = sh.dim;
  Posted& pm = posted_[static_cast<size_t>(si)];
  JTOK_CHECK(pm.premix_fwd && pm.premix_fwd->done() && pm.premix.N == N && pm.premix.K == K,
             "a JTok-M backward without its posted forward");
  // Premix + dedup: this shard's gradient pushes of earlier micro-batches are added first, so each
  // row's sum keeps the order of the posts (this exchange's serves add to the same rows).
  if (std::find(push_shard_.begin(), push_shard_.end(), si) != push_shard_.end()) finish_grads();
  // dL/de (d per premixed position) to the owners, in the forward's request order; the owners
  // answer dL/dw and add the rows' gradients (sources in rank order: the blocking order of sums).
  pm.premix_bwd = std::make_unique<RequestReply>(premix_backward_messages(pm.premix, de, d), d, K, premix_backward_serve(sh, pm.premix), /*ordered=*/true);
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
  const TableShard& sh = shards_[static_cast<size_t>(s)];
  post_push(grad_messages(sh.own, sh.dim, g.ids, nullptr, g.rows.data()), s, t, /*pairs=*/false);
  g.clear();
}

void ShardedTables::mix(float* e, int64_t table_base, const int32_t* ids, const int32_t* sel, const float* w, int64_t N,
                        int64_t K) {
  JTOK_PROFILE("embp_mix");
  const int s = where_[static_cast<size_t>(table_base)].first;
  const int64_t d = shards_[static_cast<size_t>(s)].dim;
  Posted& pm = posted_[static_cast<size_t>(s)];
  // Complete the exchanges mix_post started (post them now if it did not: no overlap).
  const bool posted = (pm.premix_fwd && !pm.premix_fwd->done()) || (pm.pairs_fwd && !pm.pairs_fwd->done());
  if (!posted) post_mix(table_base, ids, sel, w, N, K);
  JTOK_CHECK(pm.premix.N == N && pm.premix.K == K, "JTok-M mix of ", N, " x ", K, " after a post of ", pm.premix.N,
             " x ", pm.premix.K);
  {
    JTOK_PROFILE("embp_mix_wait");
    for (RequestReply* rr : {pm.premix_fwd.get(), pm.pairs_fwd.get()})
      if (rr) {
        rr->wait();
        bytes_.add({rr->sent_bytes(), rr->recv_bytes()});
      }
  }
  if (pm.premix_fwd) place_replies(e, pm.premix.where, *pm.premix_fwd, d);
  if (!pm.pairs_fwd) return;
  Naive& nv = naive_[static_cast<size_t>(s)];
  nv.rows.resize(nv.pair_ids.size() * static_cast<size_t>(d));
  place_replies(nv.rows.data(), pm.pair_where, *pm.pairs_fwd, d);
  mix_fetched(e, s, w, N, K);
}

// The fetched rows mixed here with the model's kernel, as the local path mixes.
void ShardedTables::mix_fetched(float* e, int s, const float* w, int64_t N, int64_t K) {
  const Naive& nv = naive_[static_cast<size_t>(s)];
  const int64_t d = shards_[static_cast<size_t>(s)].dim;
  for (int64_t n = 0; n < N; ++n) {
    const int32_t* slot = nv.slot.data() + n * K;
    if (slot[0] < 0) continue;  // premixed by the owner
    mix_position(e + n * d, [&](int64_t k) { return nv.rows.data() + static_cast<int64_t>(slot[k]) * d; }, w + n * K, K, d);
  }
}

void ShardedTables::mix_backward(float* dw, int64_t table_base, const float* de, int64_t N, int64_t K) {
  JTOK_PROFILE("embp_mix_bwd");
  const int s = where_[static_cast<size_t>(table_base)].first;
  if (mode_ != Mode::kNaive) {  // complete the exchange mix_backward_post started (post it now if it did not)
    Posted& pm = posted_[static_cast<size_t>(s)];
    if (!pm.premix_bwd) post_mix_backward(table_base, de, N, K);
    {
      JTOK_PROFILE("embp_mix_bwd_wait");
      pm.premix_bwd->wait();
    }
    bytes_.add({pm.premix_bwd->sent_bytes(), pm.premix_bwd->recv_bytes()});
    place_replies(dw, pm.premix.where, *pm.premix_bwd, K);
    pm.premix_bwd.reset();
    for (auto& r : pm.premix.recv) std::vector<int32_t>().swap(r);
    if (mode_ == Mode::kPremix) return;
  }
  mix_backward_fetched(dw, s, de, N, K);
}

// Fetched rows (naive, and premix + dedup's other ids): dL/dw here, and each pair's gradient row
// (w_k de summed over its positions, in position order) pushed to the owner.
void ShardedTables::mix_backward_fetched(float* dw, int s, const float* de, int64_t N, int64_t K) {
  const TableShard& sh = shards_[static_cast<size_t>(s)];
  const Naive& nv = naive_[static_cast<size_t>(s)];
  const int64_t d = sh.dim, S = static_cast<int64_t>(nv.pair_ids.size());
  std::vector<float> grows(static_cast<size_t>(S * d), 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    const int32_t* slot = nv.slot.data() + n * K;
    if (slot[0] < 0) continue;  // premixed: dL/dw came from the owner
    const float* g = de + n * d;
    mix_position_dw(dw + n * K, g, [&](int64_t k) { return nv.rows.data() + static_cast<int64_t>(slot[k]) * d; }, K, d);
    for (int64_t k = 0; k < K; ++k) mix_term_grad(grows.data() + static_cast<int64_t>(slot[k]) * d, nv.w[n * K + k], g, d);
  }
  post_push(grad_messages(sh.own, d, nv.pair_ids, &nv.pair_tables, grows.data()), s, 0, /*pairs=*/true);
}

void ShardedTables::clear_grads() {
  finish_grads();
  for (auto& s : shards_)
    for (auto& g : s.grads) g.clear();
}

double ShardedTables::grad_sum_squares() {
  finish_grads();
  double ss = 0;
  for (const auto& s : shards_)
    for (const auto& g : s.grads) ss += g.sum_squares();
  allreduce_sum(&ss, 1);
  return ss;
}

void ShardedTables::gather_to_root(Model& m) {
  JTOK_PROFILE("embp_gather_to_root");
  finish_grads();
  for (size_t k = 0; k < m.tables.size(); ++k) {
    const auto [si, t] = where_[k];
    const TableShard& s = shards_[static_cast<size_t>(si)];
    const TokenTable& shard = s.tables[static_cast<size_t>(t)];
    if (rank() == 0) m.tables[k] = TokenTable::in_ram(s.own.V, s.dim);
    gather_rows_to_root(s.own, shard, shard.data(), rank() == 0 ? m.tables[k].mutable_data() : nullptr);
  }
}

TableBytes ShardedTables::take_bytes() {
  finish_grads();  // their bytes belong to this step
  const TableBytes b = bytes_;
  bytes_ = {};
  return b;
}

int64_t ShardedTables::table_bytes() const {
  int64_t b = 0;
  for (const auto& s : shards_) b += s.table_bytes();
  return b;
}

}  // namespace jtok::dist
