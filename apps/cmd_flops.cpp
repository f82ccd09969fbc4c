// `jtok flops`: parameter counts (N_c, N_n, eta, rho, total), training FLOPs per token, and the
// memory a training run holds (state, and one micro-batch's activations by component).
#include <cstdio>
#include "commands.h"
#include "model/activation_bytes.h"
#include "scaling/flops.h"
#include "scaling/memory_plan.h"
#include "train/config.h"

namespace {
void setup(CLI::App* sub) {
  static std::string path;
  static std::vector<std::string> sets;
  static bool json = false;
  static int64_t seq_len = 0, micro_batch = 0;
  sub->add_option("--config", path, "config JSON file")->required();
  sub->add_option("--set", sets, "override a field: name=value (repeatable)");
  sub->add_option("--seq-len", seq_len, "sequence length for the attention FLOPs (default: the config's seq_len)");
  sub->add_option("--micro-batch", micro_batch, "sequences per micro-batch for the activation memory (default: the config's micro_batch_size)");
  sub->add_flag("--json", json, "print one JSON object");
  sub->callback([] {
    jtok::Config cfg = jtok::load_config(path, sets);
    const int64_t T = seq_len > 0 ? seq_len : cfg.train.seq_len;
    const int64_t B = micro_batch > 0 ? micro_batch : cfg.train.micro_batch_size;
    jtok::FlopsReport r = jtok::flops_report(cfg.model, T);
    const jtok::ActivationBytes ab = jtok::activation_bytes(cfg.model, B, T);
    const int64_t state = 4 * 4 * r.n_total;  // weights, gradients, two AdamW moments in fp32 (dense: an upper bound)
    const jtok::MemoryPlan plan = jtok::memory_plan(cfg, B, T);  // what train holds (train_only, sparse table grads)
    if (json) {
      nlohmann::json j = jtok::to_json(r);
      j["memory_bytes"] = {{"micro_batch", B}, {"seq_len", T}, {"state_fp32", state},
                           {"activations", {{"residual", ab.residual}, {"attention", ab.attention}, {"mlp", ab.mlp},
                                            {"token_tables_worst_case", ab.tables}, {"logits", ab.logits},
                                            {"total", ab.total()}}},
                           {"txt_attention_probs_not_kept", ab.attention_probs_txt}, {"plan", jtok::to_json(plan)}};
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    std::printf("parameters\n");
    std::printf("  N_c (attention qkvo + MLP)  %14lld  (attention %lld, MLP %lld%s)\n", (long long)r.n_c,
                (long long)r.n_c_attention, (long long)r.n_c_mlp, cfg.model.is_moe() ? ", activated experts" : "");
    if (cfg.model.is_moe())
      std::printf("  MoE experts not activated   %14lld  (%lld routed experts, %lld per token)\n",
                  (long long)r.n_experts_inactive, (long long)cfg.model.n_routed_experts,
                  (long long)cfg.model.num_experts_per_tok);
    std::printf("  N_n (token-indexed tables)  %14lld\n", (long long)r.n_n);
    std::printf("  eta = N_n / N_c             %14.4f\n", r.eta);
    std::printf("  rho = K / n_e               %14.4f\n", r.rho);
    std::printf("  embedding                   %14lld\n", (long long)r.n_embedding);
    std::printf("  lm_head                     %14lld%s\n", (long long)r.n_lm_head, cfg.model.tie_word_embeddings ? "  (tied)" : "");
    std::printf("  norms + other               %14lld\n", (long long)(r.n_norms + r.n_other));
    std::printf("  total                       %14lld\n", (long long)r.n_total);
    std::printf("training FLOPs per token (seq_len %lld; forward + backward = 3 x forward)\n", (long long)T);
    std::printf("  6 N_c (paper's C = 6 N_c D) %14.6g\n", r.flops_6nc);
    std::printf("  + lm_head 6 d Vp            %14.6g\n", r.flops_lm_head);
    std::printf("  + causal attention          %14.6g\n", r.flops_attention);
    std::printf("  + routers (JTok-M, MoE)       %14.6g\n", r.flops_router);
    std::printf("  + JTok/JTok-M element-wise  %14.6g\n", r.flops_token_indexed);
    std::printf("  = exact                     %14.6g  (%.3fx of 6 N_c)\n", r.flops_per_token,
                r.flops_6nc > 0 ? r.flops_per_token / r.flops_6nc : 0.0);
    std::printf("  exact, full-square attention %13.6g  (as the masked kernels compute it; for MFU)\n",
                r.flops_per_token_full_square);
    std::printf("  per step (%lld tokens)      %14.6g\n", (long long)cfg.train.tokens_per_step(),
                r.flops_per_token * double(cfg.train.tokens_per_step()));
    auto gib = [](int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); };
    std::printf("training memory (fp32; micro-batch %lld x %lld tokens)\n", (long long)B, (long long)T);
    std::printf("  weights + grads + AdamW     %14.3f GiB  (dense upper bound)\n", gib(state));
    std::printf("  activations                 %14.3f GiB\n", gib(ab.total()));
    std::printf("    residual stream + norms   %14.3f GiB\n", gib(ab.residual));
    std::printf("    attention (O(T) state)    %14.3f GiB  (T x T probabilities, not kept: %.3f GiB)\n", gib(ab.attention),
                gib(ab.attention_probs_txt));
    std::printf("    MLP / MoE                 %14.3f GiB\n", gib(ab.mlp));
    std::printf("    JTok / JTok-M rows        %14.3f GiB  (every id distinct: an upper bound)\n", gib(ab.tables));
    std::printf("    logits (N x Vp)           %14.3f GiB\n", gib(ab.logits));
    std::printf("  total                       %14.3f GiB\n", gib(state + ab.total()));
    std::printf("memory plan of `jtok train` (train_only %s; what it checks against MemAvailable)\n",
                cfg.train.train_only.c_str());
    std::printf("%s", jtok::memory_plan_text(plan, "  ").c_str());
  });
}
const bool registered = jtok::register_command({"flops", "parameter counts (N_c, N_n, eta, rho) and FLOPs per token", setup});
}  // namespace
