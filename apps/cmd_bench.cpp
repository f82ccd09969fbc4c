// `jtok bench-train`: times the trainer's own steps and prints one JSON line per model
// (train/bench_train.h says what each line holds). bench/train_throughput.sh compares it with PyTorch.
#include <cstdio>

#include "commands.h"
#include "core/error.h"
#include "cuda/device.h"
#include "scaling/flops.h"
#include "train/bench_train.h"

namespace cmd_bench {

jtok::BenchTrainOptions args;
std::string device = "cpu";

// --device cuda: a device must be present (or an error naming the driver / runtime seen); MFU
// against its bf16 tensor-core peak unless --peak-gflops says otherwise.
void use_cuda_device() {
  const jtok::cuda::DeviceInfo d = jtok::cuda::require_cuda_device();
  std::fprintf(stderr, "device: %s\n", jtok::cuda::describe(d).c_str());
  if (args.peak_gflops <= 0) args.peak_gflops = d.bf16_peak_tflops * 1e3;
  args.device = "cuda";
}

void run() {
  if (device == "cuda") use_cuda_device();
  else args.device = device;
  // The same count `train` and `jtok flops` use: 6 per weight per token (LM head included, activated
  // experts only), attention as the full causal square our kernels compute, JTok's element-wise work.
  args.flops_per_token = [](const jtok::Config& c) {
    return jtok::flops_report(c.model, c.train.seq_len).flops_per_token_full_square;
  };
  for (const nlohmann::json& j : jtok::bench_train(args)) std::printf("%s\n", j.dump().c_str());
}

void setup(CLI::App* sub) {
  sub->add_option("--config", args.config, "config JSON")->required();
  sub->add_option("--set", args.sets, "override a config field: name=value (repeatable)");
  sub->add_option("--variant", args.variants,
                  "LABEL:NAME=VALUE[,NAME=VALUE...]: also time this variant, steps interleaved with the base "
                  "(repeatable)");
  sub->add_option("--steps", args.steps, "timed steps")->check(CLI::PositiveNumber);
  sub->add_option("--warmup", args.warmup, "untimed steps first");
  sub->add_option("--peak-gflops", args.peak_gflops,
                  "peak of the machine for MFU, GFLOP/s (--device cuda: default the GPU's bf16 tensor-core peak)");
  sub->add_option("--data", args.data, "token shards: a directory of *.bin or one shard (default data/train)");
  sub->add_flag("--random-ids", args.random_ids,
                "one batch of uniform random ids reused every step instead of the shards (shape-only studies)");
  sub->add_option("--device", device,
                  "where the model trains: cpu (default) or cuda (an NVIDIA GPU); loopback (tests): the GPU "
                  "trainer's path with the CPU engine as its device")
      ->check(CLI::IsMember({"cpu", "cuda", "loopback"}));
  sub->footer(
      "Environment (--device cuda): JTOK_PROFILE=1 adds each phase's milliseconds a step (events between "
      "phases); JTOK_KERNEL_TRACE=FILE writes the timed steps' kernels, copies and memsets as CSV (CUPTI: "
      "bench/gpu_kernels_report.py reads it).");
  sub->callback(run);
}

const bool registered = jtok::register_command(
    {"bench-train", "time training steps on consecutive token-shard batches (throughput benchmark)", setup});

}  // namespace cmd_bench
