// Data parallelism for `mpirun -np P jtok train`: every rank holds the
// whole model (backbone and token-indexed tables replicated), trains on its share of each global
// step's batch, and the gradients are summed over ranks before one identical optimizer step on
// every rank, so the replicas stay equal bit for bit.
//
// The global batch of a step is gradient_accumulation_steps micro-batches of micro_batch_size rows,
// exactly the rows a single process reads. Every rank advances the same loader through all of them
// (the loader state stays exact for resume and is the same on every rank) and trains on its share:
//   - micro-batch split (when P divides gradient_accumulation_steps): rank r runs micro-batches
//     r, r + P, r + 2P, ... whole. Every micro-batch is the one a single process runs, so the
//     per-micro-batch aux losses (MoE, JTok-M load balancing) are the same functions of the same
//     tokens: P ranks compute the single process's gradient, summed in another order.
//   - row split (otherwise, when P divides micro_batch_size): rank r runs rows
//     [r B/P, (r+1) B/P) of every micro-batch. The LM loss is the same mean, but the aux losses
//     are computed over each rank's rows (as DDP does): a small, real difference in the aux terms.
//
// Gradient exchange: the backbone's flat gradient buffer by dist::allreduce_sum (fixed rank order);
// the tables' row-sparse gradients as (id, row) lists gathered from every rank and summed in rank
// order (the paper's replicated "naive" baseline, row lists rather than dense V x d). The summed
// gradient is identical on every rank, so clipping (global norm over backbone and tables) and
// AdamW run identically everywhere.
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/communicator.h"
#include "model/config.h"
#include "model/transformer.h"

namespace jtok::dist {

struct BatchShare {
  bool by_micro_batch = true;  // else by rows
  int64_t rank = 0, ranks = 1;
  int64_t row_lo = 0, row_hi = 0;   // rows of each micro-batch this rank trains on (row split)
  float grad_scale = 1.0f;          // the backward's grad_scale for one micro-batch of this rank
  bool runs(int64_t micro_batch) const { return !by_micro_batch || micro_batch % ranks == rank; }
};
// This rank's share of a step of `accumulation_steps` micro-batches of `micro_batch_size` rows with
// the world's P ranks; fails naming the fields when P divides neither.
BatchShare batch_share(int64_t micro_batch_size, int64_t accumulation_steps, int64_t rank, int64_t ranks);
// This rank's pair (a, b) next to every other rank's, in rank order (a collective).
void gather_pairs(const BatchShare& share, int64_t a, int64_t b, std::vector<int64_t>& as, std::vector<int64_t>& bs);

// Bytes this rank sent and received in one step's gradient exchange.
struct ExchangeBytes {
  int64_t backbone_sent = 0, backbone_recv = 0, table_sent = 0, table_recv = 0;
};
// The backbone gradient summed in buckets while the backward runs (dist::BucketedSum): one bucket
// per layer (its parameters are contiguous in m.grads), started from the backward's
// Activations::on_layer_grads_ready of the last micro-batch this rank runs in the step, last layer
// first, every rank in the same order; the parameters outside the layers (embedding, final norm,
// lm_head) are the last buckets, started by sum_gradients after the backward, which then waits for
// all. The sums are the blocking allreduce_sum's, bit for bit. With a frozen backbone
// (Model::backbone_frozen) only the trainable tensors are summed (each layer's JTok / JTok-M
// scalers and routers); the frozen ones' gradients are 0 on every rank and are not sent.
class GradBuckets {
 public:
  explicit GradBuckets(const Model& m);
  // The hook for Activations::on_layer_grads_ready: starts layer l's bucket and moves the others on.
  void layer_ready(Model& m, int64_t layer);
  // Starts every bucket not started yet (in a fixed order) and waits for all.
  void finish(Model& m);
  int64_t started() const { return sum_.buckets(); }

 private:
  std::vector<std::pair<int64_t, int64_t>> layer_;  // [begin, end) of each layer's parameters in m.grads
  std::vector<std::pair<int64_t, int64_t>> rest_;   // the ranges outside the layers
  std::vector<bool> done_;
  BucketedSum sum_;
  friend ExchangeBytes sum_gradients(Model& m, bool tables, GradBuckets* buckets);
};

// Sums m.grads and (if `tables`) m.table_grads over all ranks in place (no-op in a world of one).
// Sharded tables (dist/sharded_tables.h) have their own exchange: tables = false. With `buckets`,
// the backbone's sum is the buckets' (started during the backward, finished here); without, one
// blocking allreduce_sum after the backward.
ExchangeBytes sum_gradients(Model& m, bool tables = true, GradBuckets* buckets = nullptr);
// The table-gradient merge on its own: `packed` is every rank's pack_table_grads output in rank
// order (sizes[j] bytes each); the result replaces m.table_grads.
std::vector<char> pack_table_grads(const Model& m);
void merge_table_grads(Model& m, const std::vector<char>& packed, const std::vector<int64_t>& sizes);

// {"backbone_sent": [per rank], "backbone_recv": [...], "table_sent": [...], "table_recv": [...]}
// (a collective: every rank must call it).
nlohmann::json gather_bytes_json(const ExchangeBytes& b);

}  // namespace jtok::dist

namespace jtok::dist {

// A digest of every routing decision of one micro-batch (MoE top-k experts, JTok-M top-K tables,
// as sets per position and layer), keyed by the position's place in the global batch (micro-batch
// mb, global row row_lo + b, t): a sum of 40-bit hashes, so the digests of a step's micro-batches
// (and of the ranks' shares) add up to the same number however the batch was split. Two runs whose
// step digests agree made the same routing choices; a differing digest marks a flipped near-tie.
int64_t routing_digest(const Activations& acts, int64_t mb, int64_t row_lo);

}  // namespace jtok::dist
