// `jtok bench-train`'s work: times the trainer's own steps (forward, backward, AdamW: TrainSteps,
// train/trainer.h) and reports one JSON object per model. bench/train_throughput.sh compares it with
// PyTorch.
//
// Tokens: consecutive batches of the prepared token shards (BenchTrainOptions::data, default data/train; the
// loader's sequential mode from the start of the first shard), a new batch every micro-batch, warm-up
// steps included, so token-table dedup and the deferred table catch-up work as in training. Loading
// is not timed. random_ids instead draws one batch of uniform random ids (from the config's seed)
// and reuses it every step: a shape-only study, whose tables see almost no repeated ids and no row
// that leaves and comes back. Every line reports, beside the timings, the unique-id fraction of the
// timed micro-batches (unique input ids / B*T: mean, min, max); the (table, row) pairs the deferred
// exact table AdamW brought current per timed step (rows_caught_up_per_step; of them
// warm_rows_caught_up_per_step had non-zero moments and replayed full AdamW updates,
// warm_steps_replayed_per_step of them) and in the final sync (sync_rows_caught_up); the (table,
// row) pairs each timed step updated with a gradient (rows_stepped_per_step, rows_stepped_each: the
// table AdamW's rows, whose bytes it moves); and an FNV-1a
// 64 of every step's ids (tokens_fnv1a: inputs then targets of each micro-batch as little-endian
// int32, the offset basis of src/data/shard.h), which the PyTorch peer (tests/reference/
// train_bench.py) prints too: equal hashes, the same tokens.
//
// With variants LABEL:NAME=VALUE[,NAME=VALUE...] it also builds each variant (the
// config plus those overrides) and runs the models' steps interleaved, base, variant 1, ..., base,
// ...: every round times each model once under the same machine conditions, so a variant's cost
// against the base, 1 - (base step time / variant step time), can be taken per round and its
// median is robust to the drift of a shared machine. One JSON line per model, the base first.
// Every model trains on the same batches in the same step (one stream, read once per step).
//
// Table updates the dense table optimizer deferred (rows without a gradient, train/optimizer.h)
// are owed, not saved: after the timed steps each model brings every table row current
// (sync_tables), timed as sync_ms and charged to the steps (tokens_per_s, step_ms; each round's
// cost carries 1/rounds of it). cost_cpu_each / cost_cpu_median: the same costs in CPU seconds of
// all threads, a check on a shared machine, where wall time also counts the cores taken away.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/config.h"

namespace jtok {

struct BenchTrainOptions {
  std::string config;
  std::vector<std::string> sets, variants;  // --set NAME=VALUE; --variant LABEL:NAME=VALUE[,...]
  int64_t steps = 5, warmup = 1;
  double peak_gflops = 0;  // the machine's fp32 peak, for MFU; 0 = none
  std::string data = "data/train";
  bool random_ids = false;
  std::string device = "cpu";  // "cuda": the steps on one GPU (train/tables_cuda.h)
  // Training FLOPs per token of a config (the count `train` and `jtok flops` use), for gflops.
  std::function<double(const Config&)> flops_per_token;
};

// Runs the benches (the base config, then each variant, steps interleaved) and returns one JSON
// object per model, the base first. Fails naming the option on a bad variant or missing shards.
std::vector<nlohmann::json> bench_train(const BenchTrainOptions& opt);

}  // namespace jtok
