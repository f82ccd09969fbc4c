// Embedding parallelism (paper 3.5.3): the rows of the token-indexed tables are sharded
// over the ranks by token id, and a rank reaches the rows it does not own through exchanges with
// their owners. This file holds the shard (a TokenTable of the owned rows per table, with its
// id-to-row map: the one row store, read and written through model/token_table.h's gather and
// scatter) and the exchanges:
//   - JTok: fetch_rows / push_row_grads. A rank sends the micro-batch's unique ids (deduplicated)
//     to their owners, which return each row once; the backward sends each unique id's gradient
//     row back, and the owner accumulates it.
//   - JTok-M, owner-rank premixing: premix_forward sends, per position, (id, the K selected table
//     indices, the K weights) to the id's owner, which mixes e = sum_k w_k E_{sel_k}[id] from its
//     own rows (the model's mix kernel, model/jtokm_mix.h) and returns the one d-vector;
//     premix_backward sends dL/de (d per position), the owner accumulates w_k dL/de into row
//     E_{sel_k}[id] and returns the K weight gradients dL/dw_k = dL/de . E_{sel_k}[id].
//   - JTok-M, naive (the comparison): naive_fetch sends each unique (id, table) pair the positions
//     selected and the owner returns the raw row (d per pair; the requester mixes); the backward
//     returns the pair's gradient row (push_pair_grads).
// All n_e tables of one JTok-M layer share one ownership (the owner of id x holds E_1[x]..E_ne[x]).
// The owner's side of each exchange is one serve_* function below; the blocking exchanges post a
// RequestReply (dist/communicator.h) with it and wait, and dist::ShardedTables posts the same
// serves ahead of need. A world of one exchanges with itself (copies). Owners serve requests in
// source-rank order, then in each source's order, so accumulations are in a fixed order: a run
// with a given P is reproducible bit for bit.
//
// Byte counters count what crosses to other ranks (a rank's requests to itself are local copies):
//   fetch_rows    request 4 B per unique remote id, reply 4d B per unique remote id
//   push_row_grads              (4 + 4d) B per unique remote id
//   premix_forward  request (4 + 8K) B per remote position, reply 4d B per remote position
//   premix_backward request 4d B per remote position, reply 4K B per remote position
//   naive_fetch     request 8 B per unique remote (id, table) pair, reply 4d B per pair
//   push_pair_grads (8 + 4d) B per unique remote (id, table) pair
// (tests/test_dist_embp.cpp asserts these on a known batch; `jtok embp-plan` evaluates them.)
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "dist/communicator.h"
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
// layer: its n_e tables): per table, the rows this rank owns as a TokenTable (shard_in_ram: its
// id-to-row map is own's) and their gradients (row-sparse, keyed by the shard's row), accumulated
// by the owner from every rank's contributions. The tables' AdamW state is the trainer's
// (train/table_optimizer.h), which brings rows current through `sync`.
struct TableShard {
  RowOwner own;
  int rank = 0;
  int64_t n_tables = 0, dim = 0, rows = 0;  // rows = own.rows_on(rank)
  std::vector<TokenTable> tables;           // per table: (rows, dim), ids own.global(rank, r)
  std::vector<SparseRowGrad> grads;         // per table, keyed by shard row
  // Optional: called (table within the group, shard row) before a row is read to answer a
  // request: an optimizer that defers rows without a gradient brings them current.
  RowSync sync;
  int64_t table_bytes() const;  // rows x dim floats per table
  // The gradient row of `id` in table t (created zeroed on first use).
  float* grad_row(int64_t t, int32_t id) {
    return grads[static_cast<size_t>(t)].row(static_cast<int32_t>(tables[static_cast<size_t>(t)].row_of(id)));
  }
};
// A shard of `n_tables` tables of V x d; `full` (optional, n_tables pointers to V x d rows) gives
// the values of the owned rows (tests); otherwise zeros.
TableShard make_shard(const RowOwner& own, int rank, int64_t n_tables, int64_t dim, const std::vector<const float*>& full = {});
// The ids rank `rank` owns, in shard-row order.
std::vector<int32_t> owned_ids(const RowOwner& own, int rank);

// The owner's side of the exchanges (the model's gather and mix kernels on the shard's rows).
// Rows: out (n, d) = table t's rows of ids; pairs: req (n, 2) = (id, table), out (n, d) their rows.
void serve_rows(const TableShard& s, int64_t t, const int32_t* ids, int64_t n, float* out);
void serve_pairs(const TableShard& s, const int32_t* req, int64_t n, float* out);
// Premix: req (n, 1 + 2K) = (id, K tables, K weights as float bits); out (n, d) = sum_k w_k E_k[id].
void serve_premix(const TableShard& s, const int32_t* req, int64_t n, int64_t K, float* out);
// Its backward: de (n, d) for the forward's requests req; dw (n, K) = de . E_k[id], and each
// row's gradient += w_k de (requests in order).
void serve_premix_backward(TableShard& s, const int32_t* req, const float* de, int64_t n, int64_t K, float* dw);
// Gradient rows pushed to the owner: msg (n, item) = (id, [table,] d float bits); pairs: the table
// is in the message, else it is `table`. Added in message order.
void add_pushed_grads(TableShard& s, const int32_t* msg, int64_t n, bool pairs, int64_t table);

struct TableBytes {
  int64_t sent = 0, recv = 0;
  void add(const TableBytes& o) { sent += o.sent, recv += o.recv; }
};

// JTok: out (U, d) = rows of `table` for rb.unique, from their owners.
TableBytes fetch_rows(float* out, const TableShard& s, int64_t table, const RowBatch& rb);
// JTok backward: the row gradients (R, d) of ids (R distinct) go to their owners, which add them
// into s.grads[table] (source-rank order, then each source's order).
TableBytes push_row_grads(TableShard& s, int64_t table, const std::vector<int32_t>& ids, const float* grows);
inline TableBytes push_row_grads(TableShard& s, int64_t table, const RowBatch& rb, const float* grows) {
  return push_row_grads(s, table, rb.unique, grows);
}

// Gradient rows to their owners: per owner, (id, [table,] d float bits) per row of ids (with
// tables: (id, table) pairs), rows grows (R, d) in order; the message of add_pushed_grads.
std::vector<std::vector<int32_t>> grad_messages(const RowOwner& own, int64_t d, const std::vector<int32_t>& ids,
                                                const std::vector<int32_t>* tables, const float* grows);

// Requests routed to each id's owner: for i < n, owner(ids[i])'s message gets ids[i] (then
// tables[i] when tables is given: (id, table) pairs), and where[owner] records i, so replies land
// with place_replies(out, where, ...).
struct OwnerRequests {
  std::vector<std::vector<int32_t>> req, where;  // per owner
};
OwnerRequests route_to_owners(const RowOwner& own, const int32_t* ids, const int32_t* tables, size_t n);

// A JTok-M layer's premix exchange, as the requester sent it and the owner received it (what the
// backward needs of the forward).
struct PremixState {
  int64_t K = 0, N = 0;
  std::vector<std::vector<int32_t>> where;  // per owner: the position of each request sent there
  std::vector<std::vector<int32_t>> recv;   // per source: its requests as received, (1 + 2K) words each
};
// The premix requests of the positions n with premixed[n] (nullptr: all) to their owners, and
// st.where. The owner serves them with premix_serve (which keeps st.recv for the backward).
std::vector<std::vector<int32_t>> premix_requests(PremixState& st, const RowOwner& own, const int32_t* ids,
                                                  const int32_t* sel, const float* w, int64_t N, int64_t K,
                                                  const char* premixed = nullptr);
// The RequestReply serves (dist/communicator.h) of the owner's side: serve_premix keeping st.recv;
// serve_premix_backward on st.recv.
RequestReply::Serve premix_serve(TableShard& s, PremixState& st);
RequestReply::Serve premix_backward_serve(TableShard& s, PremixState& st);
// The premix backward's messages: per owner, dL/de (d floats) of each position sent there in the
// forward, in the forward's request order (st.where); de (N, d).
std::vector<std::vector<int32_t>> premix_backward_messages(const PremixState& st, const float* de, int64_t d);
// The d-float (or K-float) replies of an exchange copied to the positions they answer: out row
// where[j][i] = rank j's reply i (`width` floats each).
void place_replies(float* out, const std::vector<std::vector<int32_t>>& where, const RequestReply& rr, int64_t width);
// JTok-M forward with owner-rank premixing: e (N, d) = sum_k w[n,k] E_{sel[n,k]}[ids[n]] for the
// n_e tables of shard s. ids (N), sel (N, K) table indices in [0, n_tables), w (N, K).
TableBytes premix_forward(float* e, PremixState& st, TableShard& s, const int32_t* ids, const int32_t* sel,
                          const float* w, int64_t N, int64_t K);
// Backward: de (N, d) = dL/de. Owners add w_k de into their rows' gradients; dw (N, K) = dL/dw.
TableBytes premix_backward(float* dw, TableShard& s, PremixState& st, const float* de);

// Premix with deduplication (the paper's EmbP + Dedup; dist::ShardedTables "premix-dedup",
// plan_premix_dedup): an id with `positions` positions in a micro-batch that select `pairs`
// distinct (id, table) pairs is premixed if that moves no more bytes, forward + backward, than
// fetching its pairs' rows: positions x ((4 + 8K) + 4d + 4d + 4K) <= pairs x (8 + 4d + (8 + 4d)).
inline bool premix_cheaper(int64_t positions, int64_t pairs, int64_t K, int64_t d) {
  return positions * ((4 + 8 * K + 4 * d) + (4 * d + 4 * K)) <= pairs * ((8 + 8 + 4 * d) + 4 * d);
}

// JTok-M naive: rows (S, d) of the unique (id, table) pairs (pair_ids[q], pair_tables[q]).
TableBytes naive_fetch(float* rows, const TableShard& s, const std::vector<int32_t>& pair_ids,
                       const std::vector<int32_t>& pair_tables);
// Its backward: the pairs' gradient rows (S, d) to their owners.
TableBytes push_pair_grads(TableShard& s, const std::vector<int32_t>& pair_ids, const std::vector<int32_t>& pair_tables,
                           const float* grows);

}  // namespace jtok::dist
