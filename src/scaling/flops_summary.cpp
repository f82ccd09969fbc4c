#include "scaling/flops_summary.h"

#include <cstdarg>
#include <cstdio>

namespace jtok {

FlopsSummary flops_summary(const Config& cfg, int64_t seq_len, int64_t micro_batch) {
  FlopsSummary s;
  s.seq_len = seq_len > 0 ? seq_len : cfg.train.seq_len;
  s.micro_batch = micro_batch > 0 ? micro_batch : cfg.train.micro_batch_size;
  s.flops = flops_report(cfg.model, s.seq_len);
  s.activations = activation_bytes(cfg.model, s.micro_batch, s.seq_len);
  s.state_fp32 = 4 * 4 * s.flops.n_total;
  s.plan = memory_plan(cfg, s.micro_batch, s.seq_len);
  s.gpu_plan = device_memory_plan(cfg, s.micro_batch, s.seq_len);
  return s;
}

nlohmann::json to_json(const FlopsSummary& s) {
  const ActivationBytes& ab = s.activations;
  nlohmann::json j = to_json(s.flops);
  j["memory_bytes"] = {{"micro_batch", s.micro_batch}, {"seq_len", s.seq_len}, {"state_fp32", s.state_fp32},
                       {"activations", {{"residual", ab.residual}, {"attention", ab.attention}, {"mlp", ab.mlp},
                                        {"token_tables_worst_case", ab.tables}, {"logits", ab.logits},
                                        {"total", ab.total()}}},
                       {"txt_attention_probs_not_kept", ab.attention_probs_txt}, {"plan", to_json(s.plan)},
                       {"gpu_plan", to_json(s.gpu_plan)}};
  return j;
}

namespace {

// Appends printf-formatted text to out.
__attribute__((format(printf, 2, 3))) void appendf(std::string& out, const char* fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  const size_t at = out.size();
  out.resize(at + static_cast<size_t>(n) + 1);
  std::vsnprintf(out.data() + at, static_cast<size_t>(n) + 1, fmt, ap2);
  va_end(ap2);
  out.resize(at + static_cast<size_t>(n));
}

void parameters_text(std::string& o, const FlopsReport& r, const ModelConfig& m) {
  appendf(o, "parameters\n");
  appendf(o, "  N_c (attention qkvo + MLP)  %14lld  (attention %lld, MLP %lld%s)\n", (long long)r.n_c,
          (long long)r.n_c_attention, (long long)r.n_c_mlp, m.is_moe() ? ", activated experts" : "");
  if (m.is_moe())
    appendf(o, "  MoE experts not activated   %14lld  (%lld routed experts, %lld per token)\n",
            (long long)r.n_experts_inactive, (long long)m.n_routed_experts, (long long)m.num_experts_per_tok);
  appendf(o, "  N_n (token-indexed tables)  %14lld\n", (long long)r.n_n);
  appendf(o, "  eta = N_n / N_c             %14.4f\n", r.eta);
  appendf(o, "  rho = K / n_e               %14.4f\n", r.rho);
  appendf(o, "  embedding                   %14lld\n", (long long)r.n_embedding);
  appendf(o, "  lm_head                     %14lld%s\n", (long long)r.n_lm_head, m.tie_word_embeddings ? "  (tied)" : "");
  appendf(o, "  norms + other               %14lld\n", (long long)(r.n_norms + r.n_other));
  appendf(o, "  total                       %14lld\n", (long long)r.n_total);
}

void flops_text(std::string& o, const FlopsReport& r, int64_t T, int64_t tokens_per_step) {
  appendf(o, "training FLOPs per token (seq_len %lld; forward + backward = 3 x forward)\n", (long long)T);
  appendf(o, "  6 N_c (paper's C = 6 N_c D) %14.6g\n", r.flops_6nc);
  appendf(o, "  + lm_head 6 d Vp            %14.6g\n", r.flops_lm_head);
  appendf(o, "  + causal attention          %14.6g\n", r.flops_attention);
  appendf(o, "  + routers (JTok-M, MoE)       %14.6g\n", r.flops_router);
  appendf(o, "  + JTok/JTok-M element-wise  %14.6g\n", r.flops_token_indexed);
  appendf(o, "  = exact                     %14.6g  (%.3fx of 6 N_c)\n", r.flops_per_token,
          r.flops_6nc > 0 ? r.flops_per_token / r.flops_6nc : 0.0);
  appendf(o, "  exact, full-square attention %13.6g  (as the masked kernels compute it; for MFU)\n",
          r.flops_per_token_full_square);
  appendf(o, "  per step (%lld tokens)      %14.6g\n", (long long)tokens_per_step,
          r.flops_per_token * double(tokens_per_step));
}

double gib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }

void memory_text(std::string& o, const FlopsSummary& s) {
  const ActivationBytes& ab = s.activations;
  appendf(o, "training memory (fp32; micro-batch %lld x %lld tokens)\n", (long long)s.micro_batch, (long long)s.seq_len);
  appendf(o, "  weights + grads + AdamW     %14.3f GiB  (dense upper bound)\n", gib(s.state_fp32));
  appendf(o, "  activations                 %14.3f GiB\n", gib(ab.total()));
  appendf(o, "    residual stream + norms   %14.3f GiB\n", gib(ab.residual));
  appendf(o, "    attention (O(T) state)    %14.3f GiB  (T x T probabilities, not kept: %.3f GiB)\n", gib(ab.attention),
          gib(ab.attention_probs_txt));
  appendf(o, "    MLP / MoE                 %14.3f GiB\n", gib(ab.mlp));
  appendf(o, "    JTok / JTok-M rows        %14.3f GiB  (every id distinct: an upper bound)\n", gib(ab.tables));
  appendf(o, "    logits (N x Vp)           %14.3f GiB\n", gib(ab.logits));
  appendf(o, "  total                       %14.3f GiB\n", gib(s.state_fp32 + ab.total()));
}

}  // namespace

std::string flops_summary_text(const FlopsSummary& s, const Config& cfg) {
  std::string o;
  parameters_text(o, s.flops, cfg.model);
  flops_text(o, s.flops, s.seq_len, cfg.train.tokens_per_step());
  memory_text(o, s);
  appendf(o, "memory plan of `jtok train` (train_only %s; what it checks against MemAvailable)\n",
          cfg.train.train_only.c_str());
  o += memory_plan_text(s.plan, "  ");
  appendf(o, "GPU memory plan of `jtok train --device cuda` (precision %s; what it checks against the GPU's memory)\n",
          cfg.train.precision.c_str());
  o += memory_plan_text(s.gpu_plan, "  ");
  return o;
}

}  // namespace jtok
