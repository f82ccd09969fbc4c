// `jtok bench-train`: times full training steps (forward, backward, AdamW) on random tokens, with
// no data loading, and prints one JSON line. bench/train_throughput.sh compares it with PyTorch.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "model/config.h"
#include "scaling/flops.h"
#include "model/transformer.h"
#include "train/optimizer.h"

namespace {

struct Args {
  std::string config;
  std::vector<std::string> sets;
  int64_t steps = 5, warmup = 1;
  double peak_gflops = 0;
} args;

void run() {
  using namespace jtok;
  Config cfg = load_config(args.config, args.sets);
  const auto& t = cfg.train;
  Model m = make_model(cfg.model, t.seed);
  AdamWState opt = make_adamw_state(m);
  Activations acts;
  const int64_t B = t.micro_batch_size, T = t.seq_len, N = B * T;
  std::mt19937_64 rng(t.seed);
  std::vector<int32_t> x(N), y(N);
  for (auto& v : x) v = static_cast<int32_t>(rng() % cfg.model.vocab_size);
  for (auto& v : y) v = static_cast<int32_t>(rng() % cfg.model.vocab_size);
  double total_s = 0, cpu_s = 0;  // cpu_s: CPU seconds of all threads (std::clock), timed steps
  double loss = 0;
  std::vector<double> step_ms;  // each timed step: the minimum is the least disturbed by other jobs
  for (int64_t s = 0; s < args.warmup + args.steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    zero_grads(m);
    for (int64_t mb = 0; mb < t.gradient_accumulation_steps; ++mb) {
      forward(m, acts, x.data(), B, T);
      loss = backward(m, acts, x.data(), y.data(), 1.0f / static_cast<float>(t.gradient_accumulation_steps));
    }
    optimizer_step(m, opt, t);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= args.warmup) {
      total_s += dt;
      step_ms.push_back(1e3 * dt);
      cpu_s += static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    }
  }
  const double tokens = static_cast<double>(t.tokens_per_step()) * args.steps;
  const double tps = tokens / total_s;
  // The same count `train` and `jtok flops` use: 6 per weight per token (LM head included, activated
  // experts only), attention as the full causal square our kernels compute, JTok's element-wise work.
  const double gflops = tps * flops_report(cfg.model, T).flops_per_token_full_square / 1e9;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  nlohmann::json j = {{"engine", "jtok"},       {"tokens_per_s", tps},
                      {"step_ms", 1e3 * total_s / args.steps}, {"step_ms_each", step_ms},
                      {"step_ms_min", *std::min_element(step_ms.begin(), step_ms.end())}, {"gflops", gflops},
                      {"cpu_s_per_step", cpu_s / args.steps},
                      {"params", num_params(m)}, {"peak_rss_mb", ru.ru_maxrss / 1024.0},
                      {"loss", loss}};
  if (args.peak_gflops > 0) j["mfu"] = gflops / args.peak_gflops;
  std::printf("%s\n", j.dump().c_str());
}

void setup(CLI::App* sub) {
  sub->add_option("--config", args.config, "config JSON")->required();
  sub->add_option("--set", args.sets, "override a config field: name=value (repeatable)");
  sub->add_option("--steps", args.steps, "timed steps")->check(CLI::PositiveNumber);
  sub->add_option("--warmup", args.warmup, "untimed steps first");
  sub->add_option("--peak-gflops", args.peak_gflops, "fp32 peak of the machine, for MFU");
  sub->callback(run);
}

const bool registered =
    jtok::register_command({"bench-train", "time training steps on random tokens (throughput benchmark)", setup});

}  // namespace
