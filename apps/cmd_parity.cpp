// `jtok parity`: runs the engine on given weights and batch and writes logits, losses, gradients
// (LM loss and MoE aux loss apart) and final weights, for comparison with the PyTorch reference (tests/test_parity_dense.py).
#include <cstdio>
#include <cstring>

#include "commands.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/transformer.h"
#include "model/weights_io.h"
#include "train/config.h"
#include "train/optimizer.h"

namespace {

struct Args {
  std::string config, weights, batch, out;
  int64_t steps = 10;
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

// One optimizer step over the M micro-batches; step 0 also puts its logits and gradients into out.
void parity_step(jtok::Model& m, jtok::AdamWState& opt, jtok::Activations& acts, const jtok::Config& cfg,
                 const ParityBatch& pb, int64_t s, jtok::StFile& out, ParitySeries& series) {
  using namespace jtok;
  zero_grads(m);
  double loss = 0, aux = 0, jaux = 0;
  const int64_t M = pb.M;
  for (int64_t mb = 0; mb < M; ++mb) {
    const int32_t* xs = pb.inputs(s, mb);
    forward(m, acts, xs, pb.B, pb.T);
    if (s == 0 && mb == 0) out.tensors["logits"] = real_logits(acts, cfg.model, pb.B, pb.T);
    loss += backward(m, acts, xs, pb.labels(s, mb), 1.0f / static_cast<float>(M)) / M;
    aux += acts.moe_aux_loss / M;
    jaux += acts.jtokm_aux_loss / M;
  }
  if (s == 0)
    for (auto& [k, t] : grads_to_st(m, "grad.").tensors) out.tensors[k] = t;
  StepStats st = optimizer_step(m, opt, cfg.train);
  series.losses.push_back(static_cast<float>(loss));
  series.auxes.push_back(static_cast<float>(aux));
  series.jauxes.push_back(static_cast<float>(jaux));
  series.norms.push_back(static_cast<float>(st.grad_norm));
  series.lrs.push_back(static_cast<float>(st.lr));
}

void run() {
  using namespace jtok;
  Config cfg = load_config(args.config);
  Model m = make_model(cfg.model, cfg.train.seed);
  load_weights(m, read_safetensors(args.weights), args.weights);
  const ParityBatch pb = read_parity_batch(args.batch);
  AdamWState opt = make_adamw_state(m);
  Activations acts;
  acts.row_sync = table_row_sync(m, opt);
  ParitySeries series;
  StFile out;
  for (int64_t s = 0; s < args.steps; ++s) parity_step(m, opt, acts, cfg, pb, s, out, series);
  const int64_t S = args.steps;
  out.tensors["loss"] = st_f32({S}, series.losses.data());
  out.tensors["aux_loss"] = st_f32({S}, series.auxes.data());  // MoE load-balancing loss (0 for dense)
  out.tensors["jtokm_aux_loss"] = st_f32({S}, series.jauxes.data());  // JTok-M load-balancing loss (0 without it)
  out.tensors["grad_norm"] = st_f32({S}, series.norms.data());
  out.tensors["lr"] = st_f32({S}, series.lrs.data());
  sync_tables(m, opt);
  for (auto& [k, t] : weights_to_st(m).tensors) out.tensors["final." + k] = t;
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
  sub->callback(run);
}

const bool registered = jtok::register_command(
    {"parity", "run N training steps from given weights and dump logits, losses, gradients (for tests)", setup});

}  // namespace
