// Embedding parallelism (paper 3.5.3): the rows of the token-indexed tables are sharded
// over the ranks by token id, and a rank reaches the rows it does not own through exchanges with
// their owners. This file holds the shard (its rows and AdamW moments only) and the exchanges:
//   - JTok: fetch_rows / push_row_grads. A rank sends the micro-batch's unique ids (deduplicated)
//     to their owners, which return each row once; the backward sends each unique id's gradient
//     row back, and the owner accumulates it.
//   - JTok-M, owner-rank premixing: premix_forward sends, per position, (id, the K selected table
//     indices, the K weights) to the id's owner, which mixes e = sum_k w_k E_{sel_k}[id] from its
//     own rows and returns the one d-vector; premix_backward sends dL/de (d per position), the
//     owner accumulates w_k dL/de into row E_{sel_k}[id] and returns the K weight gradients
//     dL/dw_k = dL/de . E_{sel_k}[id].
//   - JTok-M, naive (the comparison): naive_fetch sends each unique (id, table) pair the positions
//     selected and the owner returns the raw row (d per pair; the requester mixes); the backward
//     returns the pair's gradient row (push_pair_grads).
// All n_e tables of one JTok-M layer share one ownership (the owner of id x holds E_1[x]..E_ne[x]).
// Exchanges are MPI_Alltoallv (dist::alltoallv); a world of one exchanges with itself (copies).
// Owners process requests in source-rank order, then in each source's order, so accumulations are
// in a fixed order: a run with a given P is reproducible bit for bit.
//
// Byte counters count what crosses to other ranks (a rank's requests to itself are local copies):
//   fetch_rows    request 4 B per unique remote id, reply 4d B per unique remote id
//   push_row_grads              (4 + 4d) B per unique remote id
//   premix_forward  request (4 + 8K) B per remote position, reply 4d B per remote position
//   premix_backward request 4d B per remote position, reply 4K B per remote position
//   naive_fetch     request 8 B per unique remote (id, table) pair, reply 4d B per pair
//   push_pair_grads (8 + 4d) B per unique remote (id, table) pair
// (tests/test_dist_embp.cpp asserts these on a known batch; `jtok embp-plan` evaluates them.)
//
// Not yet wired into the trainer: see docs/distributed.md for the hooks left to add.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/token_table.h"

namespace jtok::dist {

// Which rank owns row `id` of a V-row table among P ranks, and where the row sits in its shard.
struct RowOwner {
  enum Kind { kModP, kContiguous };
  int64_t V = 0, P = 1;
  Kind kind = kModP;  // id mod P (spreads Zipf-frequent low ids), or contiguous ranges of ceil(V/P)
  int64_t chunk() const { return (V + P - 1) / P; }
  int owner(int64_t id) const { return static_cast<int>(kind == kModP ? id % P : id / chunk()); }
  int64_t local(int64_t id) const { return kind == kModP ? id / P : id % chunk(); }
  int64_t global(int rank, int64_t local_row) const { return kind == kModP ? local_row * P + rank : rank * chunk() + local_row; }
  int64_t rows_on(int rank) const;  // rows rank `rank` owns: at most ceil(V/P)
};

// One rank's shard of a group of tables indexed by the same ids (a JTok layer: 1 table; a JTok-M
// layer: its n_e tables): only the rows this rank owns, their AdamW moments, and their gradients
// (row-sparse, keyed by local row), accumulated by the owner from every rank's contributions.
struct TableShard {
  RowOwner own;
  int rank = 0;
  int64_t n_tables = 0, dim = 0, rows = 0;  // rows = own.rows_on(rank)
  std::vector<std::vector<float>> w, m, v;  // per table: (rows, dim)
  std::vector<SparseRowGrad> grads;         // per table, keyed by local row
  // Optional: called by the owner before it reads row (table, local row) to answer a request, so
  // an optimizer that defers rows without a gradient brings them current first (the row sync
  // happens at the owner; dist::ShardedTables sets it).
  std::function<void(int64_t table, int64_t local_row)> sync;
  const float* row(int64_t table, int64_t id) const { return w[table].data() + own.local(id) * dim; }
  int64_t table_bytes() const;   // rows x dim floats per table
  int64_t moment_bytes() const;  // AdamW m and v
};
// A shard of `n_tables` tables of V x d; `full` (optional, n_tables pointers to V x d rows) gives
// the values of the owned rows (tests, loading a checkpoint); otherwise zeros.
TableShard make_shard(const RowOwner& own, int rank, int64_t n_tables, int64_t dim, const std::vector<const float*>& full = {});

struct ExchangeBytes2 {
  int64_t sent = 0, recv = 0;
  void add(const ExchangeBytes2& o) { sent += o.sent, recv += o.recv; }
};

// JTok: out (U, d) = rows of `table` for rb.unique, from their owners.
ExchangeBytes2 fetch_rows(float* out, const TableShard& s, int64_t table, const RowBatch& rb);
// JTok backward: the row gradients (R, d) of ids (R distinct) go to their owners, which add them
// into s.grads[table] (source-rank order, then each source's order).
ExchangeBytes2 push_row_grads(TableShard& s, int64_t table, const std::vector<int32_t>& ids, const float* grows);
inline ExchangeBytes2 push_row_grads(TableShard& s, int64_t table, const RowBatch& rb, const float* grows) {
  return push_row_grads(s, table, rb.unique, grows);
}

// What premix_backward needs of its forward: the requests, as the owner received them and as the
// requester sent them.
struct PremixState {
  int64_t K = 0, N = 0;
  std::vector<int64_t> send_counts, recv_counts;   // requests per rank (to / from)
  std::vector<int32_t> send_pos;                    // positions in send order (grouped by owner)
  std::vector<uint32_t> recv_req;                   // received requests: (1 + 2K) int32 words each
};
// JTok-M forward with owner-rank premixing: e (N, d) = sum_k w[n,k] E_{sel[n,k]}[ids[n]] for the
// n_e tables of shard s. ids (N), sel (N, K) table indices in [0, n_tables), w (N, K).
ExchangeBytes2 premix_forward(float* e, PremixState& st, const TableShard& s, const int32_t* ids, const int32_t* sel,
                              const float* w, int64_t N, int64_t K);
// Backward: de (N, d) = dL/de. Owners add w_k de into their rows' gradients; dw (N, K) = dL/dw.
ExchangeBytes2 premix_backward(float* dw, TableShard& s, const PremixState& st, const float* de);

// Premix with deduplication (the paper's EmbP + Dedup; dist::ShardedTables "premix-dedup",
// plan_premix_dedup): an id with `positions` positions in a micro-batch that select `pairs`
// distinct (id, table) pairs is premixed if that moves no more bytes, forward + backward, than
// fetching its pairs' rows: positions x ((4 + 8K) + 4d + 4d + 4K) <= pairs x (8 + 4d + (8 + 4d)).
inline bool premix_cheaper(int64_t positions, int64_t pairs, int64_t K, int64_t d) {
  return positions * ((4 + 8 * K + 4 * d) + (4 * d + 4 * K)) <= pairs * ((8 + 8 + 4 * d) + 4 * d);
}

// JTok-M naive: rows (S, d) of the unique (id, table) pairs (pair_ids[q], pair_tables[q]).
ExchangeBytes2 naive_fetch(float* rows, const TableShard& s, const std::vector<int32_t>& pair_ids,
                           const std::vector<int32_t>& pair_tables);
// Its backward: the pairs' gradient rows (S, d) to their owners.
ExchangeBytes2 push_pair_grads(TableShard& s, const std::vector<int32_t>& pair_ids, const std::vector<int32_t>& pair_tables,
                               const float* grows);

}  // namespace jtok::dist
