// `jtok parity`: runs the trainer's own steps (TrainSteps) on given weights and batch and writes
// logits, losses, gradients (LM loss and MoE aux loss apart) and final weights, for comparison with
// the PyTorch reference (tests/test_parity_dense.py).
#include <cstdio>
#include <cstring>

#include "commands.h"
#include "core/error.h"
#include "cuda/device.h"
#include "io/safetensors.h"
#include "model/transformer.h"
#include "model/weights_io.h"
#include "train/config.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace cmd_parity {

struct Args {
  std::string config, weights, batch, out;
  int64_t steps = 10;
  std::string device = "cpu";
  bool series_only = false;
} args;

// The --batch file's input_ids and labels: (M, B, T), the same M micro-batches at every step, or
// (S, M, B, T), step s using batch s % S.
struct ParityBatch {
  std::vector<int32_t> x, y;
  int64_t S = 1, M = 0, B = 0, T = 0;
  const int32_t* inputs(int64_t step, int64_t mb) const { return x.data() + offset(step, mb); }
  const int32_t* labels(int64_t step, int64_t mb) const { return y.data() + offset(step, mb); }
  int64_t offset(int64_t step, int64_t mb) const { return ((step % S) * M + mb) * B * T; }
};

ParityBatch read_parity_batch(const std::string& path) {
  using namespace jtok;
  StFile batch = read_safetensors(path);
  for (const char* k : {"input_ids", "labels"})
    if (!batch.tensors.count(k)) fail(path, ": missing tensor ", k);
  const StTensor& xt = batch.tensors.at("input_ids");
  const StTensor& yt = batch.tensors.at("labels");
  if (xt.dtype != "I32" || yt.dtype != "I32" || (xt.shape.size() != 3 && xt.shape.size() != 4) ||
      xt.shape != yt.shape)
    fail(path, ": input_ids and labels must be int32 (M, B, T) or (S, M, B, T) of the same shape");
  const size_t r = xt.shape.size();
  ParityBatch pb;
  pb.S = r == 4 ? xt.shape[0] : 1;
  pb.M = xt.shape[r - 3], pb.B = xt.shape[r - 2], pb.T = xt.shape[r - 1];
  pb.x = xt.as_i32(), pb.y = yt.as_i32();
  return pb;
}

// The per-step series parity writes (each one value a step).
struct ParitySeries {
  std::vector<float> losses, auxes, jauxes, norms, lrs;
};

// The first micro-batch's logits over the real vocabulary, (B, T, V) from acts.logits (N, Vp).
jtok::StTensor real_logits(const jtok::Activations& acts, const jtok::ModelConfig& mc, int64_t B, int64_t T) {
  const int64_t N = B * T, V = mc.vocab_size, Vp = mc.padded_vocab();
  std::vector<float> logits(static_cast<size_t>(N * V));
  for (int64_t n = 0; n < N; ++n) std::memcpy(&logits[n * V], &acts.logits[n * Vp], sizeof(float) * V);
  return jtok::st_f32({B, T, V}, logits.data());
}

// The batch's micro-batches in the order the trainer reads them: step s's M of batch s % S.
jtok::BatchSource parity_source(const ParityBatch& pb, int64_t& served) {
  jtok::BatchSource source;
  source.next = [&pb, &served](int32_t* x, int32_t* y, int64_t, int64_t) {
    const int64_t s = served / pb.M, mb = served % pb.M;
    const size_t n = static_cast<size_t>(pb.B * pb.T);
    std::memcpy(x, pb.inputs(s, mb), n * sizeof(int32_t));
    std::memcpy(y, pb.labels(s, mb), n * sizeof(int32_t));
    ++served;
  };
  return source;
}

// The trainer's own steps (TrainSteps); step 0's logits (one forward on the first micro-batch)
// and gradients also go into out.
void run_parity_steps(jtok::TrainSteps& steps, const ParityBatch& pb, jtok::StFile& out, ParitySeries& series) {
  using namespace jtok;
  for (int64_t s = 0; s < args.steps; ++s) {
    if (s == 0 && !args.series_only) {
      Activations acts;
      forward(steps.model(), acts, pb.inputs(0, 0), pb.B, pb.T);
      out.tensors["logits"] = real_logits(acts, steps.model().cfg, pb.B, pb.T);
    }
    steps.compute_gradients();
    if (s == 0 && !steps.on_device() && !args.series_only)  // a device's gradients stay there: tests/cuda compares them
      for (auto& [k, t] : grads_to_st(steps.model(), "grad.").tensors) out.tensors[k] = t;
    const TrainSteps::Result r = steps.apply();
    series.losses.push_back(static_cast<float>(r.loss));
    series.auxes.push_back(static_cast<float>(r.moe_aux));
    series.jauxes.push_back(static_cast<float>(r.jtokm_aux));
    series.norms.push_back(static_cast<float>(r.grad_norm));
    series.lrs.push_back(static_cast<float>(r.lr));
  }
}

void run() {
  using namespace jtok;
  const ParityBatch pb = read_parity_batch(args.batch);
  Config cfg = load_config(args.config);  // the batch's shape is the step's
  cfg.train.gradient_accumulation_steps = pb.M, cfg.train.micro_batch_size = pb.B, cfg.train.seq_len = pb.T;
  validate(cfg, args.config + " with the shape of " + args.batch);
  int64_t served = 0;
  BatchSource source = parity_source(pb, served);
  TrainOptions opt;
  opt.device = args.device;
  if (args.device == "cuda") cuda::require_cuda_device();
  opt.init_weights = [](Model& m) { load_weights(m, read_safetensors(args.weights), args.weights); };
  TrainSteps steps(cfg, opt, source);
  ParitySeries series;
  StFile out;
  run_parity_steps(steps, pb, out, series);
  const int64_t S = args.steps;
  out.tensors["loss"] = st_f32({S}, series.losses.data());
  out.tensors["aux_loss"] = st_f32({S}, series.auxes.data());  // MoE load-balancing loss (0 for dense)
  out.tensors["jtokm_aux_loss"] = st_f32({S}, series.jauxes.data());  // JTok-M load-balancing loss (0 without it)
  out.tensors["grad_norm"] = st_f32({S}, series.norms.data());
  out.tensors["lr"] = st_f32({S}, series.lrs.data());
  if (!args.series_only) {
    steps.finish();     // every table row current
    steps.copy_back();  // a device's weights and tables into the host model
    for (auto& [k, t] : weights_to_st(steps.model()).tensors) out.tensors["final." + k] = t;
  }
  write_safetensors(args.out, out);
  std::printf("parity: %lld steps, loss %.6f -> %.6f, wrote %s\n", static_cast<long long>(S), series.losses.front(),
              series.losses.back(), args.out.c_str());
}

void setup(CLI::App* sub) {
  sub->add_option("--config", args.config, "config JSON (model and training fields)")->required();
  sub->add_option("--weights", args.weights, "initial weights, safetensors")->required();
  sub->add_option("--batch", args.batch, "safetensors with input_ids and labels, int32 (M,B,T), or (S,M,B,T) for batch s % S at step s")->required();
  sub->add_option("--steps", args.steps, "optimizer steps")->check(CLI::PositiveNumber);
  sub->add_option("--out", args.out, "output safetensors")->required();
  sub->add_option("--device", args.device,
                  "where the steps run: cpu (default), cuda (an NVIDIA GPU: no grad.* tensors in the output) or "
                  "loopback (the GPU path with the CPU engine)")
      ->check(CLI::IsMember({"cpu", "cuda", "loopback"}));
  sub->add_flag("--series-only", args.series_only,
                "write only the per-step series (loss, aux losses, grad_norm, lr): no logits, gradients or final "
                "weights (long runs of big models: bench/gpu_loss_curve.sh)");
  sub->callback(run);
}

const bool registered = jtok::register_command(
    {"parity", "run N training steps from given weights and dump logits, losses, gradients (for tests)", setup});

}  // namespace cmd_parity
