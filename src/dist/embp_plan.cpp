#include "dist/embp_plan.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "core/error.h"
#include "core/splitmix.h"

namespace jtok::dist {

namespace {

std::vector<int32_t> sorted_unique(std::vector<int32_t> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// Adds, for `count` items that rank r asks of owner o, `req` bytes each way out and `rep` back.
void add_pair(RankBytes& b, int r, int o, int64_t count, int64_t req, int64_t rep) {
  if (r == o || count == 0) return;
  b[r].sent += count * req;
  b[o].recv += count * req;
  b[o].sent += count * rep;
  b[r].recv += count * rep;
}

// Unique (id, table) pairs of a rank's selections.
std::vector<std::pair<int32_t, int32_t>> unique_pairs(const std::vector<int32_t>& ids, const std::vector<int32_t>& sel, int64_t K) {
  std::vector<std::pair<int32_t, int32_t>> p;
  p.reserve(ids.size() * static_cast<size_t>(K));
  for (size_t n = 0; n < ids.size(); ++n)
    for (int64_t k = 0; k < K; ++k) p.emplace_back(ids[n], sel[n * static_cast<size_t>(K) + static_cast<size_t>(k)]);
  std::sort(p.begin(), p.end());
  p.erase(std::unique(p.begin(), p.end()), p.end());
  return p;
}

}  // namespace

RankBytes plan_jtok(const std::vector<std::vector<int32_t>>& ids, const RowOwner& own, int64_t d) {
  RankBytes b(ids.size());
  for (size_t r = 0; r < ids.size(); ++r)
    for (int32_t id : sorted_unique(ids[r])) {
      const int o = own.owner(id);
      add_pair(b, static_cast<int>(r), o, 1, 4, 4 * d);      // forward: id, row back
      add_pair(b, static_cast<int>(r), o, 1, 4 + 4 * d, 0);  // backward: id + gradient row
    }
  return b;
}

RankBytes plan_premix(const std::vector<std::vector<int32_t>>& ids, const RowOwner& own, int64_t K, int64_t d) {
  RankBytes b(ids.size());
  for (size_t r = 0; r < ids.size(); ++r) {
    std::vector<int64_t> per_owner(static_cast<size_t>(own.P), 0);
    for (int32_t id : ids[r]) ++per_owner[static_cast<size_t>(own.owner(id))];
    for (int o = 0; o < own.P; ++o) {
      add_pair(b, static_cast<int>(r), o, per_owner[static_cast<size_t>(o)], 4 + 8 * K, 4 * d);  // forward
      add_pair(b, static_cast<int>(r), o, per_owner[static_cast<size_t>(o)], 4 * d, 4 * K);      // backward
    }
  }
  return b;
}

RankBytes plan_naive(const std::vector<std::vector<int32_t>>& ids, const std::vector<std::vector<int32_t>>& sel,
                     const RowOwner& own, int64_t K, int64_t d) {
  RankBytes b(ids.size());
  for (size_t r = 0; r < ids.size(); ++r)
    for (const auto& [id, t] : unique_pairs(ids[r], sel[r], K)) {
      const int o = own.owner(id);
      add_pair(b, static_cast<int>(r), o, 1, 8, 4 * d);      // forward: (id, table), row back
      add_pair(b, static_cast<int>(r), o, 1, 8 + 4 * d, 0);  // backward: (id, table) + gradient row
    }
  return b;
}

RankBytes plan_premix_dedup(const std::vector<std::vector<int32_t>>& ids, const std::vector<std::vector<int32_t>>& sel,
                            const RowOwner& own, int64_t K, int64_t d) {
  RankBytes b(ids.size());
  const int64_t premix_req = 4 + 8 * K + 4 * d, premix_rep = 4 * d + 4 * K;  // forward + backward, per position
  const int64_t naive_req = 8 + 8 + 4 * d, naive_rep = 4 * d;                 // forward + backward, per pair
  for (size_t r = 0; r < ids.size(); ++r) {
    std::unordered_map<int32_t, int64_t> count;
    for (int32_t id : ids[r]) ++count[id];
    std::unordered_map<int32_t, int64_t> pairs;
    for (const auto& pr : unique_pairs(ids[r], sel[r], K)) ++pairs[pr.first];
    for (const auto& [id, c] : count) {
      const int o = own.owner(id);
      const int64_t q = pairs[id];
      if (premix_cheaper(c, q, K, d)) add_pair(b, static_cast<int>(r), o, c, premix_req, premix_rep);
      else add_pair(b, static_cast<int>(r), o, q, naive_req, naive_rep);
    }
  }
  return b;
}

namespace {

const char* const kSchemes[] = {"replicated_dense", "replicated_rows", "naive_nodedup", "naive", "premix", "premix_dedup",
                                "jtok_nodedup", "jtok"};

// What the plan adds up over the steps: per scheme, each rank's bytes (sent + received); the
// positions, unique ids and unique (id, table) pairs seen; the ids and positions each rank serves
// under both ownerships.
struct PlanTotals {
  int64_t P;
  std::map<std::string, std::vector<double>> traffic;
  double positions = 0, uniq = 0, pairs = 0;
  std::vector<double> served_mod_ids, served_con_ids, served_mod_pos, served_con_pos;
  explicit PlanTotals(int64_t ranks)
      : P(ranks), served_mod_ids(ranks, 0), served_con_ids(ranks, 0), served_mod_pos(ranks, 0), served_con_pos(ranks, 0) {
    for (const char* s : kSchemes) traffic[s].assign(static_cast<size_t>(P), 0.0);
  }
  void add(const char* s, const RankBytes& b, double times) {
    for (int64_t r = 0; r < P; ++r) traffic[s][r] += times * static_cast<double>(b[r].sent + b[r].recv);
  }
};

// The step's batch rows: consecutive windows of the data from *cursor.
std::vector<std::vector<int32_t>> step_rows(const std::vector<int32_t>& tokens, const PlanOptions& o, uint64_t* cursor) {
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(o.batch));
  for (auto& row : rows) {
    row.resize(static_cast<size_t>(o.seq));
    for (auto& t : row) {
      t = tokens[*cursor % tokens.size()];
      if (t < 0 || t >= o.vocab) fail("embp-plan: token id ", t, " outside the vocabulary of ", o.vocab);
      ++*cursor;
    }
  }
  return rows;
}

// Synthetic routing of layer l: K distinct tables per position (a partial Fisher-Yates over n_e
// driven by a hash of the id, or of the position).
std::vector<int32_t> synthetic_selection(const std::vector<int32_t>& ids, const PlanOptions& o, int64_t l, int64_t step,
                                         int64_t mb, int64_t r) {
  std::vector<int32_t> sel(ids.size() * static_cast<size_t>(o.K));
  for (size_t n = 0; n < ids.size(); ++n) {
    uint64_t h = o.routing == "per-id" ? mix64(o.seed ^ (static_cast<uint64_t>(ids[n]) << 8) ^ static_cast<uint64_t>(l))
                                       : mix64(o.seed ^ (static_cast<uint64_t>(step) << 48) ^ (static_cast<uint64_t>(mb) << 36) ^
                                               (static_cast<uint64_t>(r) << 24) ^ (n << 8) ^ static_cast<uint64_t>(l));
    std::vector<int32_t> pool(static_cast<size_t>(o.n_e));
    for (int64_t i = 0; i < o.n_e; ++i) pool[i] = static_cast<int32_t>(i);
    for (int64_t k = 0; k < o.K; ++k) {
      h = mix64(h);
      const int64_t j = k + static_cast<int64_t>(h % static_cast<uint64_t>(o.n_e - k));
      std::swap(pool[k], pool[j]);
      sel[n * o.K + k] = pool[k];
    }
  }
  return sel;
}

// One micro-batch's JTok exchanges (every JTok layer alike), with and without deduplication.
void plan_jtok_layers(PlanTotals& t, const std::vector<std::vector<int32_t>>& ids, const RowOwner& mod, const PlanOptions& o) {
  t.add("jtok", plan_jtok(ids, mod, o.d), static_cast<double>(o.jtok_layers));
  // Without deduplication: every position's id asked for and its row returned.
  RankBytes nd(static_cast<size_t>(t.P));
  for (int64_t r = 0; r < t.P; ++r)
    for (int32_t id : ids[r]) add_pair(nd, static_cast<int>(r), mod.owner(id), 1, 4 + 4 + 4 * o.d, 4 * o.d);
  t.add("jtok_nodedup", nd, static_cast<double>(o.jtok_layers));
}

// One micro-batch's exchanges of JTok-M layer l in every scheme.
void plan_jtokm_layer(PlanTotals& t, const std::vector<std::vector<int32_t>>& ids, const RowOwner& mod, const PlanOptions& o,
                      int64_t l, int64_t step, int64_t mb) {
  const int64_t P = t.P;
  std::vector<std::vector<int32_t>> sel(static_cast<size_t>(P));
  for (int64_t r = 0; r < P; ++r) {
    sel[r] = synthetic_selection(ids[r], o, l, step, mb, r);
    t.pairs += static_cast<double>(unique_pairs(ids[r], sel[r], o.K).size());
  }
  t.add("premix", plan_premix(ids, mod, o.K, o.d), 1.0);
  t.add("naive", plan_naive(ids, sel, mod, o.K, o.d), 1.0);
  t.add("premix_dedup", plan_premix_dedup(ids, sel, mod, o.K, o.d), 1.0);
  // Naive without deduplication: K rows per position each way (the paper's K d per token).
  RankBytes nd(static_cast<size_t>(P));
  for (int64_t r = 0; r < P; ++r)
    for (int32_t id : ids[r]) add_pair(nd, static_cast<int>(r), mod.owner(id), o.K, 8 + 8 + 4 * o.d, 4 * o.d);
  t.add("naive_nodedup", nd, 1.0);
  // Replicated tables, gradients as row lists (our data-parallel baseline): each rank's unique
  // pairs (id + row, per table a 8-byte count) to every other rank.
  for (int64_t r = 0; r < P; ++r) {
    const double mine = static_cast<double>(unique_pairs(ids[r], sel[r], o.K).size()) * (4 + 4 * o.d) + 8.0 * o.n_e;
    t.traffic["replicated_rows"][r] += mine * static_cast<double>(P - 1);
    for (int64_t j = 0; j < P; ++j)
      if (j != r) t.traffic["replicated_rows"][j] += mine;
  }
}

// One micro-batch: its ids per rank, what each rank serves, and every layer's exchanges.
void plan_micro_batch(PlanTotals& t, const std::vector<std::vector<int32_t>>& rows, const PlanOptions& o, int64_t step,
                      int64_t mb) {
  const int64_t P = t.P, rows_per_rank = o.batch / P;
  const RowOwner mod{o.vocab, P, RowOwner::kModP}, contig{o.vocab, P, RowOwner::kContiguous};
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(P));
  for (int64_t r = 0; r < P; ++r)
    for (int64_t i = 0; i < o.micro_batch; ++i) {
      const auto& row = rows[static_cast<size_t>(r * rows_per_rank + mb * o.micro_batch + i)];
      ids[r].insert(ids[r].end(), row.begin(), row.end());
    }
  for (int64_t r = 0; r < P; ++r) {
    t.positions += static_cast<double>(ids[r].size());
    const auto u = sorted_unique(ids[r]);
    t.uniq += static_cast<double>(u.size());
    for (int32_t id : u) t.served_mod_ids[mod.owner(id)] += 1, t.served_con_ids[contig.owner(id)] += 1;
    for (int32_t id : ids[r]) t.served_mod_pos[mod.owner(id)] += 1, t.served_con_pos[contig.owner(id)] += 1;
  }
  if (o.jtok_layers > 0) plan_jtok_layers(t, ids, mod, o);
  for (int64_t l = 0; l < o.jtokm_layers; ++l) plan_jtokm_layer(t, ids, mod, o, l, step, mb);
}

nlohmann::json plan_report(const PlanTotals& t, const PlanOptions& o) {
  const int64_t P = t.P;
  nlohmann::json out;
  out["options"] = {{"ranks", P}, {"seq", o.seq}, {"batch", o.batch}, {"micro_batch", o.micro_batch}, {"steps", o.steps},
                    {"vocab", o.vocab}, {"d", o.d}, {"n_e", o.n_e}, {"K", o.K}, {"jtokm_layers", o.jtokm_layers},
                    {"jtok_layers", o.jtok_layers}, {"routing", o.routing}};
  out["tokens_per_step"] = o.batch * o.seq;
  nlohmann::json bytes;
  for (const char* s : kSchemes) {
    const auto& v = t.traffic.at(s);
    double mx = 0, sum = 0;
    for (double x : v) mx = std::max(mx, x / o.steps), sum += x / o.steps;
    bytes[s] = {{"max", mx}, {"mean", sum / P}};
  }
  out["bytes_per_rank_per_step"] = bytes;  // sent + received
  out["dedup_positions_per_unique_id"] = t.positions / t.uniq;
  if (t.pairs > 0) out["dedup_pair_ratio"] = t.positions * o.K * o.jtokm_layers / t.pairs;  // (position, k) per unique (id, table)
  auto imbalance = [&](const std::vector<double>& v) {
    double mx = 0, sum = 0;
    for (double x : v) mx = std::max(mx, x), sum += x;
    return sum > 0 ? mx / (sum / static_cast<double>(v.size())) : 0.0;
  };
  out["load_imbalance"] = {{"mod", {{"unique_ids", imbalance(t.served_mod_ids)}, {"positions", imbalance(t.served_mod_pos)}}},
                           {"contiguous", {{"unique_ids", imbalance(t.served_con_ids)}, {"positions", imbalance(t.served_con_pos)}}}};
  return out;
}

}  // namespace

nlohmann::json embp_plan(const std::vector<int32_t>& tokens, const PlanOptions& o) {
  if (o.ranks < 1 || o.batch % o.ranks != 0) fail("embp-plan: --ranks ", o.ranks, " must divide --batch ", o.batch);
  if (o.micro_batch < 1 || (o.batch / o.ranks) % o.micro_batch != 0)
    fail("embp-plan: --micro-batch ", o.micro_batch, " must divide the rows per rank (", o.batch / o.ranks, ")");
  if (o.K < 1 || o.K > o.n_e) fail("embp-plan: top-K ", o.K, " must be in 1..n_e (", o.n_e, ")");
  if (tokens.empty()) fail("embp-plan: no tokens");
  PlanTotals t(o.ranks);  // totals per rank over the steps (reported / steps)
  uint64_t cursor = 0;
  const int64_t mbs = o.batch / o.ranks / o.micro_batch;
  for (int64_t step = 0; step < o.steps; ++step) {
    const std::vector<std::vector<int32_t>> rows = step_rows(tokens, o, &cursor);
    for (int64_t mb = 0; mb < mbs; ++mb) plan_micro_batch(t, rows, o, step, mb);
    // Replicated, dense gradients (allreduce of every table once per step): 2 (P-1)/P of the
    // tables' bytes sent and as many received per rank.
    const double dense = 4.0 * static_cast<double>(o.vocab) * o.d * (o.n_e * o.jtokm_layers + o.jtok_layers);
    for (int64_t r = 0; r < t.P; ++r) t.traffic["replicated_dense"][r] += 2.0 * 2.0 * (t.P - 1) / t.P * dense;
  }
  return plan_report(t, o);
}

PlanOptions plan_options_for_model(const ModelConfig& m, PlanOptions o) {
  o.vocab = m.padded_vocab();
  o.d = m.hidden_size;
  o.n_e = m.jtokm_n_e;
  o.K = m.jtokm_top_k;
  o.jtokm_layers = m.jtokm ? m.jtokm_num_layers() : 0;
  o.jtok_layers = m.jtok ? m.jtok_num_layers() : 0;
  return o;
}

}  // namespace jtok::dist
