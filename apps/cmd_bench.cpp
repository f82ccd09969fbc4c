// `jtok bench-train`: times full training steps (forward, backward, AdamW) on random tokens, with
// no data loading, and prints one JSON line. bench/train_throughput.sh compares it with PyTorch.
//
// With --variant LABEL:NAME=VALUE[,NAME=VALUE...] (repeatable) it also builds each variant (the
// config plus those overrides) and runs the models' steps interleaved, base, variant 1, ..., base,
// ...: every round times each model once under the same machine conditions, so a variant's cost
// against the base, 1 - (base step time / variant step time), can be taken per round and its
// median is robust to the drift of a shared machine. One JSON line per model, the base first.
//
// Table updates the dense table optimizer deferred (rows without a gradient, train/optimizer.h)
// are owed, not saved: after the timed steps each model brings every table row current
// (sync_tables), timed as sync_ms and charged to the steps (tokens_per_s, step_ms; each round's
// cost carries 1/rounds of it).
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
#include "model/config.h"
#include "scaling/flops.h"
#include "model/transformer.h"
#include "train/optimizer.h"

namespace {

struct Args {
  std::string config;
  std::vector<std::string> sets, variants;
  int64_t steps = 5, warmup = 1;
  double peak_gflops = 0;
} args;

// One model under test: its config, weights, optimizer state, batch and timings.
struct Bench {
  std::string label;
  jtok::Config cfg;
  jtok::Model model;
  jtok::AdamWState opt;
  jtok::Activations acts;
  std::vector<int32_t> x, y;
  std::vector<double> step_ms, cpu_s;
  double sync_ms = 0;  // the final sync_tables: the deferred table updates of the timed steps
  double loss = 0;
};

std::unique_ptr<Bench> make_bench(const std::string& label, const std::vector<std::string>& sets) {
  using namespace jtok;
  auto b = std::make_unique<Bench>();
  b->label = label;
  b->cfg = load_config(args.config, sets);
  const auto& t = b->cfg.train;
  b->model = make_model(b->cfg.model, t.seed);
  b->opt = make_adamw_state(b->model);
  b->acts.row_sync = jtok::table_row_sync(b->model, b->opt);  // b is heap-allocated: the refs stay valid
  const int64_t N = t.micro_batch_size * t.seq_len;
  std::mt19937_64 rng(t.seed);  // the same tokens for every variant
  b->x.resize(N);
  b->y.resize(N);
  for (auto& v : b->x) v = static_cast<int32_t>(rng() % b->cfg.model.vocab_size);
  for (auto& v : b->y) v = static_cast<int32_t>(rng() % b->cfg.model.vocab_size);
  return b;
}

void train_step(Bench& b, bool timed) {
  using namespace jtok;
  const auto& t = b.cfg.train;
  const int64_t B = t.micro_batch_size, T = t.seq_len;
  auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();  // CPU seconds of all threads
  zero_grads(b.model);
  for (int64_t mb = 0; mb < t.gradient_accumulation_steps; ++mb) {
    forward(b.model, b.acts, b.x.data(), B, T);
    b.loss = backward(b.model, b.acts, b.x.data(), b.y.data(), 1.0f / static_cast<float>(t.gradient_accumulation_steps));
  }
  optimizer_step(b.model, b.opt, t);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (timed) {
    b.step_ms.push_back(1e3 * dt);
    b.cpu_s.push_back(static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

nlohmann::json report(const Bench& b) {
  using namespace jtok;
  double total_ms = b.sync_ms, cpu = 0;
  for (double v : b.step_ms) total_ms += v;
  for (double v : b.cpu_s) cpu += v;
  const double steps = static_cast<double>(b.step_ms.size());
  const double tps = static_cast<double>(b.cfg.train.tokens_per_step()) * steps / (total_ms / 1e3);
  // The same count `train` and `jtok flops` use: 6 per weight per token (LM head included, activated
  // experts only), attention as the full causal square our kernels compute, JTok's element-wise work.
  const double gflops = tps * flops_report(b.cfg.model, b.cfg.train.seq_len).flops_per_token_full_square / 1e9;
  nlohmann::json j = {{"engine", "jtok"},
                      {"tokens_per_s", tps},
                      {"step_ms", total_ms / steps},
                      {"step_ms_each", b.step_ms},
                      {"step_ms_min", *std::min_element(b.step_ms.begin(), b.step_ms.end())},
                      {"sync_ms", b.sync_ms},
                      {"gflops", gflops},
                      {"cpu_s_per_step", cpu / steps},
                      {"params", num_params(b.model)},
                      {"loss", b.loss}};
  if (args.peak_gflops > 0) j["mfu"] = gflops / args.peak_gflops;
  if (!args.variants.empty()) j["variant"] = b.label;
  return j;
}

void run() {
  using namespace jtok;
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
  }
  for (int64_t s = 0; s < args.warmup + args.steps; ++s)
    for (auto& b : benches) train_step(*b, s >= args.warmup);
  for (auto& b : benches) {
    const auto t0 = std::chrono::steady_clock::now();
    sync_tables(b->model, b->opt);
    b->sync_ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);  // peak RSS of the process: meaningful only without variants
  for (size_t i = 0; i < benches.size(); ++i) {
    nlohmann::json j = report(*benches[i]);
    if (args.variants.empty()) j["peak_rss_mb"] = ru.ru_maxrss / 1024.0;
    if (i > 0) {  // the cost of round r: 1 - base step time / variant step time, same round
      std::vector<double> cost;
      const Bench &b0 = *benches[0], &bi = *benches[i];
      const double R = static_cast<double>(bi.step_ms.size());
      for (size_t r = 0; r < bi.step_ms.size(); ++r)
        cost.push_back(1.0 - (b0.step_ms[r] + b0.sync_ms / R) / (bi.step_ms[r] + bi.sync_ms / R));
      j["cost_each"] = cost;
      j["cost_median"] = median(cost);
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
  sub->callback(run);
}

const bool registered =
    jtok::register_command({"bench-train", "time training steps on random tokens (throughput benchmark)", setup});

}  // namespace
