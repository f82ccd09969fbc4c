// `jtok bench-train`: times full training steps (forward, backward, AdamW) and prints one JSON line.
// bench/train_throughput.sh compares it with PyTorch.
//
// Tokens: consecutive batches of the prepared token shards (--data, default data/train; the
// loader's sequential mode from the start of the first shard), a new batch every micro-batch, warm-up
// steps included, so token-table dedup and the deferred table catch-up work as in training. Loading
// is not timed. --random-ids instead draws one batch of uniform random ids (from the config's seed)
// and reuses it every step: a shape-only study, whose tables see almost no repeated ids and no row
// that leaves and comes back. Every line reports, beside the timings, the unique-id fraction of the
// timed micro-batches (unique input ids / B*T: mean, min, max); the (table, row) pairs the deferred
// exact table AdamW brought current per timed step (rows_caught_up_per_step; of them
// warm_rows_caught_up_per_step had non-zero moments and replayed full AdamW updates,
// warm_steps_replayed_per_step of them) and in the final sync (sync_rows_caught_up); and an FNV-1a
// 64 of every step's ids (tokens_fnv1a: inputs then targets of each micro-batch as little-endian
// int32, the offset basis of src/data/shard.h), which the PyTorch peer (tests/reference/
// train_bench.py) prints too: equal hashes, the same tokens.
//
// With --variant LABEL:NAME=VALUE[,NAME=VALUE...] (repeatable) it also builds each variant (the
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
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "cuda/device.h"
#include "data/loader.h"
#include "data/shard.h"
#include "model/transformer.h"
#include "ops/bf16_weights.h"
#include "ops/linear.h"
#include "scaling/flops.h"
#include "train/config.h"
#include "train/optimizer.h"
#include "train/precision.h"
#include "train/trainer.h"

namespace {

struct Args {
  std::string config;
  std::vector<std::string> sets, variants;
  int64_t steps = 5, warmup = 1;
  double peak_gflops = 0;
  std::string data = "data/train";
  std::string device = "cpu";
  bool random_ids = false;
} args;

// The micro-batches of one step: gradient_accumulation_steps (inputs, targets) pairs of B*T ids.
using StepTokens = std::vector<jtok::Batch>;

// One model under test: its config, the trainer's steps over it (train/trainer.h TrainSteps: the
// same set-up and step as `jtok train`), the batches of the step it runs, and its timings.
struct Bench {
  std::string label;
  jtok::Config cfg;
  jtok::TrainOptions opt;
  jtok::BatchSource source;  // the micro-batches of *tokens, in order
  const StepTokens* tokens = nullptr;
  size_t next_micro_batch = 0;
  std::unique_ptr<jtok::TrainSteps> steps;
  std::vector<double> step_ms, cpu_s;
  std::vector<int64_t> caught_up, warm_rows, warm_steps;  // per timed step: AdamWState's replay counters
  int64_t sync_caught_up = 0;  // rows the final sync_tables brought current
  double sync_ms = 0;  // the final sync_tables: the deferred table updates of the timed steps
  double sync_cpu_s = 0;  // its CPU seconds (all threads)
  double loss = 0;
  jtok::AdamWState& adam() { return steps->optimizer_state(); }
};

std::unique_ptr<Bench> make_bench(const std::string& label, const std::vector<std::string>& sets) {
  using namespace jtok;
  auto b = std::make_unique<Bench>();
  b->label = label;
  b->cfg = load_config(args.config, sets);
  Bench* self = b.get();  // heap-allocated: the source's pointer stays valid
  b->source.next = [self](int32_t* x, int32_t* y, int64_t, int64_t) {
    const Batch& mb = (*self->tokens)[self->next_micro_batch++];
    std::copy(mb.inputs.begin(), mb.inputs.end(), x);
    std::copy(mb.targets.begin(), mb.targets.end(), y);
  };
  b->steps = std::make_unique<TrainSteps>(b->cfg, b->opt, b->source);
  return b;
}

// Where every model's tokens come from: consecutive shard batches, or one reused random batch.
struct TokenStream {
  int B = 0, T = 0, M = 0;
  std::unique_ptr<jtok::DataLoader> loader;
  jtok::Batch fixed;  // --random-ids
  uint64_t hash = 1469598103934665603ULL;  // FNV-1a 64 of every id served (jtok::fnv1a64's basis)
  std::vector<double> unique_frac;  // of the timed micro-batches

  StepTokens next(bool timed) {
    StepTokens st;
    for (int mb = 0; mb < M; ++mb) {
      st.push_back(loader ? loader->next_batch(B, T) : fixed);
      const jtok::Batch& b = st.back();
      // int32 little-endian (the machines this runs on), as the PyTorch peer hashes them
      hash = jtok::fnv1a64(b.inputs.data(), b.inputs.size() * sizeof(int32_t), hash);
      hash = jtok::fnv1a64(b.targets.data(), b.targets.size() * sizeof(int32_t), hash);
      if (timed) {
        std::vector<int32_t> ids = b.inputs;
        std::sort(ids.begin(), ids.end());
        const size_t unique = static_cast<size_t>(std::unique(ids.begin(), ids.end()) - ids.begin());
        unique_frac.push_back(static_cast<double>(unique) / static_cast<double>(ids.size()));
      }
    }
    return st;
  }
};

TokenStream make_stream(const jtok::Config& cfg) {
  using namespace jtok;
  TokenStream ts;
  const auto& t = cfg.train;
  ts.B = static_cast<int>(t.micro_batch_size);
  ts.T = static_cast<int>(t.seq_len);
  ts.M = static_cast<int>(t.gradient_accumulation_steps);
  if (args.random_ids) {  // today's synthetic mode: one batch of uniform ids, the same every step
    const size_t N = static_cast<size_t>(ts.B) * ts.T;
    std::mt19937_64 rng(t.seed);
    ts.fixed.B = ts.B;
    ts.fixed.T = ts.T;
    ts.fixed.inputs.resize(N);
    ts.fixed.targets.resize(N);
    for (auto& v : ts.fixed.inputs) v = static_cast<int32_t>(rng() % cfg.model.vocab_size);
    for (auto& v : ts.fixed.targets) v = static_cast<int32_t>(rng() % cfg.model.vocab_size);
    return ts;
  }
  std::vector<std::string> shards;
  try {
    shards = list_shards(args.data);
  } catch (const Error& e) {
    fail("bench-train: no token shards in ", args.data, " (", e.what(),
         "): run scripts/prepare_data.sh, pass --data DIR, or --random-ids for synthetic ids");
  }
  LoaderOptions lo;
  lo.mode = "sequential";
  lo.seed = t.seed;
  lo.vocab_size = static_cast<uint32_t>(cfg.model.vocab_size);  // every id checked against the model's
  ts.loader = std::make_unique<DataLoader>(shards, lo);
  return ts;
}

void train_step(Bench& b, const StepTokens& tokens, bool timed) {
  using namespace jtok;
  const TableMoments& tm = b.adam().tables;
  const int64_t r0 = tm.replayed_rows, w0 = tm.replayed_warm_rows, s0 = tm.replayed_warm_steps;
  auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();  // CPU seconds of all threads
  // Each model's own precision (a variant may be precision=bf16); where bf16 cannot run, fp32 (the
  // report's "precision" says which ran).
  set_matmul_precision(b.cfg.train.precision == "bf16" && bf16_matmul_supported() ? MatmulPrecision::bf16
                                                                                  : MatmulPrecision::fp32);
  b.tokens = &tokens;
  b.next_micro_batch = 0;
  b.loss = b.steps->step();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (timed) {
    b.step_ms.push_back(1e3 * dt);
    b.cpu_s.push_back(static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
    b.caught_up.push_back(tm.replayed_rows - r0);
    b.warm_rows.push_back(tm.replayed_warm_rows - w0);
    b.warm_steps.push_back(tm.replayed_warm_steps - s0);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

template <typename T>
double mean(const std::vector<T>& v) {
  double s = 0;
  for (T x : v) s += static_cast<double>(x);
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

nlohmann::json report(const Bench& b, const TokenStream& ts) {
  using namespace jtok;
  double total_ms = b.sync_ms, cpu = 0;
  for (double v : b.step_ms) total_ms += v;
  for (double v : b.cpu_s) cpu += v;
  const double steps = static_cast<double>(b.step_ms.size());
  const double tps = static_cast<double>(b.cfg.train.tokens_per_step()) * steps / (total_ms / 1e3);
  // The same count `train` and `jtok flops` use: 6 per weight per token (LM head included, activated
  // experts only), attention as the full causal square our kernels compute, JTok's element-wise work.
  const double gflops = tps * flops_report(b.cfg.model, b.cfg.train.seq_len).flops_per_token_full_square / 1e9;
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(ts.hash));
  nlohmann::json j = {{"engine", "jtok"},
                      {"tokens", args.random_ids ? std::string("random-ids") : args.data},
                      {"tokens_fnv1a", hash},
                      {"tokens_per_s", tps},
                      {"step_ms", total_ms / steps},
                      {"step_ms_each", b.step_ms},
                      {"step_ms_min", *std::min_element(b.step_ms.begin(), b.step_ms.end())},
                      {"sync_ms", b.sync_ms},
                      {"sync_cpu_s", b.sync_cpu_s},
                      {"gflops", gflops},
                      {"cpu_s_per_step", cpu / steps},
                      {"cpu_s_each", b.cpu_s},
                      {"params", num_params(b.steps->model())},
                      {"loss", b.loss},
                      {"unique_id_frac_mean", mean(ts.unique_frac)},
                      {"unique_id_frac_min", *std::min_element(ts.unique_frac.begin(), ts.unique_frac.end())},
                      {"unique_id_frac_max", *std::max_element(ts.unique_frac.begin(), ts.unique_frac.end())},
                      {"rows_caught_up_per_step", mean(b.caught_up)},
                      {"rows_caught_up_each", b.caught_up},
                      {"warm_rows_caught_up_per_step", mean(b.warm_rows)},
                      {"warm_steps_replayed_per_step", mean(b.warm_steps)},
                      {"sync_rows_caught_up", b.sync_caught_up},
                      {"precision", b.cfg.train.precision == "bf16" && bf16_matmul_supported() ? "bf16" : "fp32"}};
  if (args.peak_gflops > 0) j["mfu"] = gflops / args.peak_gflops;
  if (!args.variants.empty()) j["variant"] = b.label;
  return j;
}

// --device cuda: a device must be present (or an error naming the driver / runtime seen); the
// CUDA trainer itself is not built yet (issue 39), so even then this stops here, saying so.
void check_cuda_device() {
  const jtok::cuda::DeviceInfo d = jtok::cuda::require_cuda_device();
  jtok::fail("--device cuda: found ", jtok::cuda::describe(d),
             ", but the CUDA trainer is not built yet (--device cpu trains on the CPU)");
}

void run() {
  using namespace jtok;
  if (args.device == "cuda") check_cuda_device();
  std::vector<std::unique_ptr<Bench>> benches;
  benches.push_back(make_bench("base", args.sets));
  for (const std::string& v : args.variants) {
    const size_t colon = v.find(':');
    if (colon == std::string::npos || colon == 0)
      fail("--variant ", v, ": expected LABEL:NAME=VALUE[,NAME=VALUE...]");
    std::vector<std::string> sets = args.sets;
    std::string rest = v.substr(colon + 1);
    for (size_t p = 0; p <= rest.size();) {
      size_t q = rest.find(',', p);
      if (q == std::string::npos) q = rest.size();
      if (q > p) sets.push_back(rest.substr(p, q - p));
      p = q + 1;
    }
    benches.push_back(make_bench(v.substr(0, colon), sets));
    const TrainConfig &t0 = benches[0]->cfg.train, &ti = benches.back()->cfg.train;
    if (ti.micro_batch_size != t0.micro_batch_size || ti.seq_len != t0.seq_len ||
        ti.gradient_accumulation_steps != t0.gradient_accumulation_steps ||
        benches.back()->cfg.model.vocab_size != benches[0]->cfg.model.vocab_size)
      fail("--variant ", v, ": changes the batch shape or vocab_size; every variant must train on the base's tokens");
  }
  // The bf16 / fp32 matmul rates `train --precision bf16` measures at start (train/precision.h): the
  // ceiling of a bf16 step's speedup, reported beside it.
  PrecisionReport probe;
  for (auto& b : benches)
    if (b->cfg.train.precision == "bf16" && bf16_matmul_supported() && probe.bf16_gflops == 0)
      probe = apply_training_precision("bf16");
  TokenStream ts = make_stream(benches[0]->cfg);
  for (int64_t s = 0; s < args.warmup + args.steps; ++s) {
    const StepTokens tokens = ts.next(s >= args.warmup);  // the same batches for every model
    for (auto& b : benches) train_step(*b, tokens, s >= args.warmup);
  }
  for (auto& b : benches) {
    const int64_t r0 = b->adam().tables.replayed_rows;
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    sync_tables(b->steps->model(), b->adam());
    b->sync_ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    b->sync_cpu_s = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    b->sync_caught_up = b->adam().tables.replayed_rows - r0;
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);  // peak RSS of the process: meaningful only without variants
  for (size_t i = 0; i < benches.size(); ++i) {
    nlohmann::json j = report(*benches[i], ts);
    if (args.variants.empty()) j["peak_rss_mb"] = ru.ru_maxrss / 1024.0;
    if (j["precision"] == "bf16") {
      j["bf16_matmul_gflops"] = probe.bf16_gflops;
      j["fp32_matmul_gflops"] = probe.fp32_gflops;
    }
    if (i > 0) {  // the cost of round r: 1 - base step time / variant step time, same round
      std::vector<double> cost;
      const Bench &b0 = *benches[0], &bi = *benches[i];
      const double R = static_cast<double>(bi.step_ms.size());
      for (size_t r = 0; r < bi.step_ms.size(); ++r)
        cost.push_back(1.0 - (b0.step_ms[r] + b0.sync_ms / R) / (bi.step_ms[r] + bi.sync_ms / R));
      j["cost_each"] = cost;
      j["cost_median"] = median(cost);
      // The same in CPU seconds of all threads (the final sync's charged likewise): on a machine
      // shared with other work a step's wall time counts the time the cores were taken away, its
      // CPU seconds mostly the work done (cache and memory contention still inflate them).
      std::vector<double> cost_cpu;
      for (size_t r = 0; r < bi.cpu_s.size(); ++r)
        cost_cpu.push_back(1.0 - (b0.cpu_s[r] + b0.sync_cpu_s / R) / (bi.cpu_s[r] + bi.sync_cpu_s / R));
      j["cost_cpu_each"] = cost_cpu;
      j["cost_cpu_median"] = median(cost_cpu);
    }
    std::printf("%s\n", j.dump().c_str());
  }
}

void setup(CLI::App* sub) {
  sub->add_option("--config", args.config, "config JSON")->required();
  sub->add_option("--set", args.sets, "override a config field: name=value (repeatable)");
  sub->add_option("--variant", args.variants,
                  "LABEL:NAME=VALUE[,NAME=VALUE...]: also time this variant, steps interleaved with the base "
                  "(repeatable)");
  sub->add_option("--steps", args.steps, "timed steps")->check(CLI::PositiveNumber);
  sub->add_option("--warmup", args.warmup, "untimed steps first");
  sub->add_option("--peak-gflops", args.peak_gflops, "fp32 peak of the machine, for MFU");
  sub->add_option("--data", args.data, "token shards: a directory of *.bin or one shard (default data/train)");
  sub->add_flag("--random-ids", args.random_ids,
                "one batch of uniform random ids reused every step instead of the shards (shape-only studies)");
  sub->add_option("--device", args.device, "where the model trains: cpu (default) or cuda (an NVIDIA GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->callback(run);
}

const bool registered = jtok::register_command(
    {"bench-train", "time training steps on consecutive token-shard batches (throughput benchmark)", setup});

}  // namespace
