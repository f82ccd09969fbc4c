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

void run() {
  using namespace jtok;
  Config cfg = load_config(args.config);
  Model m = make_model(cfg.model, cfg.train.seed);
  load_weights(m, read_safetensors(args.weights), args.weights);
  StFile batch = read_safetensors(args.batch);
  for (const char* k : {"input_ids", "labels"})
    if (!batch.tensors.count(k)) fail(args.batch, ": missing tensor ", k);
  const StTensor& xt = batch.tensors.at("input_ids");
  const StTensor& yt = batch.tensors.at("labels");
  // (M, B, T): the same M micro-batches at every step; (S, M, B, T): step s uses batch s % S.
  if (xt.dtype != "I32" || yt.dtype != "I32" || (xt.shape.size() != 3 && xt.shape.size() != 4) ||
      xt.shape != yt.shape)
    fail(args.batch, ": input_ids and labels must be int32 (M, B, T) or (S, M, B, T) of the same shape");
  const size_t r = xt.shape.size();
  const int64_t S_batches = r == 4 ? xt.shape[0] : 1;
  const int64_t M = xt.shape[r - 3], B = xt.shape[r - 2], T = xt.shape[r - 1], N = B * T;
  auto x = xt.as_i32(), y = yt.as_i32();
  const int64_t V = cfg.model.vocab_size, Vp = cfg.model.padded_vocab();

  AdamWState opt = make_adamw_state(m);
  Activations acts;
  acts.row_sync = table_row_sync(m, opt);
  std::vector<float> losses, auxes, jauxes, norms, lrs;
  StFile out;
  for (int64_t s = 0; s < args.steps; ++s) {
    zero_grads(m);
    double loss = 0, aux = 0, jaux = 0;
    const int64_t step_off = (s % S_batches) * M * N;
    for (int64_t mb = 0; mb < M; ++mb) {
      const int32_t* xs = x.data() + step_off + mb * N;
      forward(m, acts, xs, B, T);
      if (s == 0 && mb == 0) {
        std::vector<float> logits(static_cast<size_t>(N * V));
        for (int64_t n = 0; n < N; ++n) std::memcpy(&logits[n * V], &acts.logits[n * Vp], sizeof(float) * V);
        out.tensors["logits"] = st_f32({B, T, V}, logits.data());
      }
      loss += backward(m, acts, xs, y.data() + step_off + mb * N, 1.0f / static_cast<float>(M)) / M;
      aux += acts.moe_aux_loss / M;
      jaux += acts.jtokm_aux_loss / M;
    }
    if (s == 0)
      for (auto& [k, t] : grads_to_st(m, "grad.").tensors) out.tensors[k] = t;
    StepStats st = optimizer_step(m, opt, cfg.train);
    losses.push_back(static_cast<float>(loss));
    auxes.push_back(static_cast<float>(aux));
    jauxes.push_back(static_cast<float>(jaux));
    norms.push_back(static_cast<float>(st.grad_norm));
    lrs.push_back(static_cast<float>(st.lr));
  }
  const int64_t S = args.steps;
  out.tensors["loss"] = st_f32({S}, losses.data());
  out.tensors["aux_loss"] = st_f32({S}, auxes.data());  // MoE load-balancing loss (0 for dense)
  out.tensors["jtokm_aux_loss"] = st_f32({S}, jauxes.data());  // JTok-M load-balancing loss (0 without it)
  out.tensors["grad_norm"] = st_f32({S}, norms.data());
  out.tensors["lr"] = st_f32({S}, lrs.data());
  sync_tables(m, opt);
  for (auto& [k, t] : weights_to_st(m).tensors) out.tensors["final." + k] = t;
  write_safetensors(args.out, out);
  std::printf("parity: %lld steps, loss %.6f -> %.6f, wrote %s\n", static_cast<long long>(S), losses.front(),
              losses.back(), args.out.c_str());
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
