// `jtok embp-plan`: the exchange volume of embedding parallelism at scales this machine
// cannot run, from real token ids. No MPI: the formulas of dist/embedding_parallel.h evaluated on
// the batches each rank would see (tests/test_dist_embp.cpp checks that they equal what the
// exchanges measure on 1 and 2 ranks).
//
// Per step the global batch is `batch` rows of `seq` tokens read consecutively from the data
// (wrapping); rank r takes rows [r B/P, (r+1) B/P) and exchanges per micro-batch of `micro_batch`
// rows (deduplication is per micro-batch, as the trainer's). JTok-M routing is not known without a
// trained model: "random" draws each position's K of n_e tables by a hash of (position, layer)
// (a pessimistic case for (id, table) deduplication); "per-id" gives every occurrence of an id the
// same K tables (the most favourable one).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/embedding_parallel.h"
#include "model/config.h"

namespace jtok::dist {

// Bytes of one exchange scheme summed over forward and backward, per rank: what it sends and what
// it receives (requests to itself are not counted).
using RankBytes = std::vector<TableBytes>;
// JTok (per table): unique ids to their owners, rows back; gradient rows back to the owners.
RankBytes plan_jtok(const std::vector<std::vector<int32_t>>& ids, const RowOwner& own, int64_t d);
// JTok-M premix (per layer): (id, K tables, K weights) and a d-vector per position each way, K back.
RankBytes plan_premix(const std::vector<std::vector<int32_t>>& ids, const RowOwner& own, int64_t K, int64_t d);
// JTok-M naive (per layer): each unique (id, table) pair: request, raw row back, gradient row.
// sel[r] (N_r, K) are rank r's selections.
RankBytes plan_naive(const std::vector<std::vector<int32_t>>& ids, const std::vector<std::vector<int32_t>>& sel,
                     const RowOwner& own, int64_t K, int64_t d);
// JTok-M premix with deduplication (planner only): per requesting rank and remote id x with c_x
// positions choosing q_x distinct tables, whichever is cheaper of premixing its c_x positions or
// fetching its q_x raw rows (mixed at the requester, as naive).
RankBytes plan_premix_dedup(const std::vector<std::vector<int32_t>>& ids, const std::vector<std::vector<int32_t>>& sel,
                            const RowOwner& own, int64_t K, int64_t d);

struct PlanOptions {
  int64_t ranks = 2, seq = 1024, batch = 8, micro_batch = 1, steps = 1;
  int64_t vocab = 50304, d = 768, n_e = 5, K = 2, jtokm_layers = 1, jtok_layers = 0;
  std::string routing = "random";  // "random" | "per-id"
  uint64_t seed = 1;
};
// o with m's table shape: padded vocabulary, d, n_e, K, and the JTok-M and JTok layers (0 where off).
PlanOptions plan_options_for_model(const ModelConfig& m, PlanOptions o);
// Whole-step figures (bytes per rank per step, summed over layers, averaged over steps; max and
// mean over ranks), dedup ratios, and the owners' load imbalance for id-mod-P and contiguous ranges.
nlohmann::json embp_plan(const std::vector<int32_t>& tokens, const PlanOptions& o);

}  // namespace jtok::dist
