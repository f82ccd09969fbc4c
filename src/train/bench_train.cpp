#include "train/bench_train.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <random>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/profile.h"
#include "cuda/device.h"
#include "cuda/kernel_trace_file.h"
#include "cuda/training.h"
#include "data/loader.h"
#include "data/shard.h"
#include "model/transformer.h"
#include "ops/linear.h"
#include "train/optimizer.h"
#include "train/precision.h"
#include "train/tables_cuda.h"
#include "train/trainer.h"

namespace jtok {

namespace {


// The micro-batches of one step: gradient_accumulation_steps (inputs, targets) pairs of B*T ids.
using StepTokens = std::vector<Batch>;

// One model under test: its config, the trainer's steps over it (train/trainer.h TrainSteps: the
// same set-up and step as `jtok train`), the batches of the step it runs, and its timings.
struct Bench {
  std::string label;
  Config cfg;
  TrainOptions opt;
  BatchSource source;  // the micro-batches of *tokens, in order
  const StepTokens* tokens = nullptr;
  size_t next_micro_batch = 0;
  std::unique_ptr<TrainSteps> steps;
  std::vector<double> step_ms, cpu_s;
  std::vector<int64_t> caught_up, warm_rows, warm_steps;  // per timed step: AdamWState's replay counters
  std::vector<int64_t> stepped;                           // per timed step: table rows updated with a gradient
  int64_t sync_caught_up = 0;  // rows the final sync_tables brought current
  double sync_ms = 0;  // the final sync_tables: the deferred table updates of the timed steps
  double sync_cpu_s = 0;  // its CPU seconds (all threads)
  double loss = 0;
  AdamWState& adam() { return steps->optimizer_state(); }
};

std::unique_ptr<Bench> make_bench(const BenchTrainOptions& args, const std::string& label, const std::vector<std::string>& sets) {
  auto b = std::make_unique<Bench>();
  b->label = label;
  b->cfg = load_config(args.config, sets);
  b->opt.device = args.device;
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
  std::unique_ptr<DataLoader> loader;
  Batch fixed;  // --random-ids
  uint64_t hash = 1469598103934665603ULL;  // FNV-1a 64 of every id served (fnv1a64's basis)
  std::vector<double> unique_frac;  // of the timed micro-batches

  StepTokens next(bool timed) {
    StepTokens st;
    for (int mb = 0; mb < M; ++mb) {
      st.push_back(loader ? loader->next_batch(B, T) : fixed);
      const Batch& b = st.back();
      // int32 little-endian (the machines this runs on), as the PyTorch peer hashes them
      hash = fnv1a64(b.inputs.data(), b.inputs.size() * sizeof(int32_t), hash);
      hash = fnv1a64(b.targets.data(), b.targets.size() * sizeof(int32_t), hash);
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

TokenStream make_stream(const BenchTrainOptions& args, const Config& cfg) {
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
  const TableMoments& tm = b.adam().tables;
  const int64_t r0 = tm.replayed_rows, w0 = tm.replayed_warm_rows, s0 = tm.replayed_warm_steps, u0 = tm.stepped_rows;
  auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();  // CPU seconds of all threads
  // Each model's own precision (a variant may be precision=bf16); where bf16 cannot run, fp32 (the
  // report's "precision" says which ran).
  set_matmul_precision(b.cfg.train.precision == "bf16" && bf16_matmul_supported() ? MatmulPrecision::bf16
                                                                                  : MatmulPrecision::fp32);
  b.tokens = &tokens;
  b.next_micro_batch = 0;
  b.loss = b.steps->step().loss;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (timed) {
    b.step_ms.push_back(1e3 * dt);
    b.cpu_s.push_back(static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
    b.caught_up.push_back(tm.replayed_rows - r0);
    b.warm_rows.push_back(tm.replayed_warm_rows - w0);
    b.warm_steps.push_back(tm.replayed_warm_steps - s0);
    b.stepped.push_back(tm.stepped_rows - u0);
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

// JTOK_PROFILE=1 on a GPU: the timed steps' milliseconds by phase (cuda/phase_profile.h), and the
// rest of a step's wall time (host work and syncs the device waited for) as host_gaps.
void add_step_breakdown(nlohmann::json& j, const Bench& b) {
  const cuda::DeviceTrainer* dev = b.steps->device();
  if (!dev) return;
  const auto phases = dev->profile_ms();
  if (phases.empty()) return;
  nlohmann::json o = nlohmann::json::object(), order = nlohmann::json::array();
  std::string line;
  double sum = 0;
  for (const auto& [phase, ms] : phases) {
    o[phase] = ms;
    order.push_back(phase);
    sum += ms;
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s %.3f", line.empty() ? "" : " | ", phase.c_str(), ms);
    line += buf;
  }
  const double wall = mean(b.step_ms);
  o["host_gaps"] = wall - sum;
  j["step_breakdown_ms"] = o;
  j["step_phases"] = order;  // the step's order (the object's keys are sorted)
  std::fprintf(stderr, "bench-train %s profile, ms a step: %s | host gaps %.3f (wall %.3f)\n", b.label.c_str(),
               line.c_str(), wall - sum, wall);
}

// The traced steps' models, for the trace's first line.
std::string trace_what(const std::vector<std::unique_ptr<Bench>>& benches) {
  std::string models;
  for (const auto& b : benches) models += (models.empty() ? "" : " ") + b->label;
  return "jtok bench-train --device cuda: models " + models;
}

nlohmann::json report(const BenchTrainOptions& args, const Bench& b, const TokenStream& ts) {
  double total_ms = b.sync_ms, cpu = 0;
  for (double v : b.step_ms) total_ms += v;
  for (double v : b.cpu_s) cpu += v;
  const double steps = static_cast<double>(b.step_ms.size());
  const double tps = static_cast<double>(b.cfg.train.tokens_per_step()) * steps / (total_ms / 1e3);
  const double gflops = tps * args.flops_per_token(b.cfg) / 1e9;
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(ts.hash));
  nlohmann::json j = {
      {"engine", "jtok"},
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
      {"rows_stepped_per_step", mean(b.stepped)},
      {"rows_stepped_each", b.stepped},
      {"device", args.device},
      {"precision",
       b.cfg.train.precision == "bf16" && (args.device == "cuda" || bf16_matmul_supported()) ? "bf16" : "fp32"}};
  if (args.peak_gflops > 0) j["mfu"] = gflops / args.peak_gflops;
  if (!args.variants.empty()) j["variant"] = b.label;
  add_step_breakdown(j, b);
  return j;
}

// The base's sets plus a variant's LABEL:NAME=VALUE[,NAME=VALUE...], checked to train on the base's tokens.
std::unique_ptr<Bench> make_variant(const BenchTrainOptions& args, const std::string& v, const Bench& base) {
  const size_t colon = v.find(':');
  if (colon == std::string::npos || colon == 0) fail("--variant ", v, ": expected LABEL:NAME=VALUE[,NAME=VALUE...]");
  std::vector<std::string> sets = args.sets;
  const std::string rest = v.substr(colon + 1);
  for (size_t p = 0; p <= rest.size();) {
    size_t q = rest.find(',', p);
    if (q == std::string::npos) q = rest.size();
    if (q > p) sets.push_back(rest.substr(p, q - p));
    p = q + 1;
  }
  std::unique_ptr<Bench> b = make_bench(args, v.substr(0, colon), sets);
  const TrainConfig &t0 = base.cfg.train, &ti = b->cfg.train;
  if (ti.micro_batch_size != t0.micro_batch_size || ti.seq_len != t0.seq_len ||
      ti.gradient_accumulation_steps != t0.gradient_accumulation_steps || b->cfg.model.vocab_size != base.cfg.model.vocab_size)
    fail("--variant ", v, ": changes the batch shape or vocab_size; every variant must train on the base's tokens");
  return b;
}

// After the timed steps: each model brings every table row current (the deferred updates it owes).
void sync_owed_rows(Bench& b) {
  const int64_t r0 = b.adam().tables.replayed_rows;
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  b.steps->finish();
  b.sync_ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  b.sync_cpu_s = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  b.sync_caught_up = b.adam().tables.replayed_rows - r0;
}

// A variant's cost against the base per round, 1 - base step time / variant step time (the final
// sync charged 1/rounds to each), in wall time and in CPU seconds of all threads: on a machine
// shared with other work a step's wall time counts the time the cores were taken away, its CPU
// seconds mostly the work done (cache and memory contention still inflate them).
void add_costs(nlohmann::json& j, const Bench& b0, const Bench& bi) {
  std::vector<double> cost, cost_cpu;
  const double R = static_cast<double>(bi.step_ms.size());
  for (size_t r = 0; r < bi.step_ms.size(); ++r)
    cost.push_back(1.0 - (b0.step_ms[r] + b0.sync_ms / R) / (bi.step_ms[r] + bi.sync_ms / R));
  for (size_t r = 0; r < bi.cpu_s.size(); ++r)
    cost_cpu.push_back(1.0 - (b0.cpu_s[r] + b0.sync_cpu_s / R) / (bi.cpu_s[r] + bi.sync_cpu_s / R));
  j["cost_each"] = cost;
  j["cost_median"] = median(cost);
  j["cost_cpu_each"] = cost_cpu;
  j["cost_cpu_median"] = median(cost_cpu);
}

// The bf16 attention kernels' rows a warp the device trainer timed and chose (cuda/attention_rows.h),
// where it did (the placement said it in words after the first step: train/tables_cuda.cpp).
void add_attention_rows(nlohmann::json& j, const cuda::AttentionRows& r) {
  if (r.fwd != 0) j["attention_rows"] = attention_rows_json(r);
}

}  // namespace

std::vector<nlohmann::json> bench_train(const BenchTrainOptions& args) {
  std::vector<std::unique_ptr<Bench>> benches;
  benches.push_back(make_bench(args, "base", args.sets));
  for (const std::string& v : args.variants) benches.push_back(make_variant(args, v, *benches[0]));
  // The bf16 / fp32 matmul rates `train --precision bf16` measures at start (train/precision.h): the
  // ceiling of a bf16 step's speedup, reported beside it (not on a GPU: they are the CPU's products).
  PrecisionReport probe;
  for (auto& b : benches)
    if (args.device != "cuda" && b->cfg.train.precision == "bf16" && bf16_matmul_supported() && probe.bf16_gflops == 0)
      probe = apply_training_precision("bf16");
  TokenStream ts = make_stream(args, benches[0]->cfg);
  cuda::KernelTraceFile trace;  // JTOK_KERNEL_TRACE=FILE: the timed steps' kernels, copies and memsets
  for (int64_t s = 0; s < args.warmup + args.steps; ++s) {
    if (s == args.warmup && profiling_enabled())  // JTOK_PROFILE=1: a GPU's timed steps by phase
      for (auto& b : benches)
        if (cuda::DeviceTrainer* dev = b->steps->device()) dev->set_profiling(true);
    if (s == args.warmup)
      trace = cuda::begin_kernel_trace(cuda::kernel_trace_path_from_env(), args.device == "cuda", "bench-train");
    const StepTokens tokens = ts.next(s >= args.warmup);  // the same batches for every model
    for (auto& b : benches) train_step(*b, tokens, s >= args.warmup);
  }
  cuda::end_kernel_trace(trace, "bench-train", trace_what(benches), args.steps);
  for (auto& b : benches) sync_owed_rows(*b);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);  // peak RSS of the process: meaningful only without variants
  std::vector<nlohmann::json> lines;
  for (size_t i = 0; i < benches.size(); ++i) {
    nlohmann::json j = report(args, *benches[i], ts);
    if (args.variants.empty()) j["peak_rss_mb"] = ru.ru_maxrss / 1024.0;
    // The device memory the process held at most (weights, moments, activations, tables; not the
    // CUDA context): peak_mem_mb as the PyTorch peer's max_memory_allocated, this model's alone
    // without variants.
    if (args.device == "cuda" && args.variants.empty())
      j["peak_mem_mb"] = static_cast<double>(cuda::device_bytes_peak()) / (1024.0 * 1024.0);
    if (args.device == "cuda") j["device_name"] = cuda::require_cuda_device().name;  // as the peer's line
    if (j["precision"] == "bf16" && probe.bf16_gflops > 0) {
      j["bf16_matmul_gflops"] = probe.bf16_gflops;
      j["fp32_matmul_gflops"] = probe.fp32_gflops;
    }
    if (i > 0) add_costs(j, *benches[0], *benches[i]);
    if (!trace.path.empty()) j["kernel_trace"] = cuda::kernel_trace_json(trace);
    if (const cuda::DeviceTrainer* dev = benches[i]->steps->device()) add_attention_rows(j, dev->attention_rows());
    lines.push_back(std::move(j));
  }
  return lines;
}

}  // namespace jtok
