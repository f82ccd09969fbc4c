// The model's configuration (Hugging Face-like field names). The config file that holds it with
// the training fields, its schema and its checks are train/config.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace jtok {

struct ModelConfig {
  std::string model_type = "jtok_dense";   // "jtok_dense" | "jtok_moe" (DeepSeekMoE-style, docs/model.md "MoE")
  int64_t vocab_size = 50257;               // real vocabulary (tokenizer's)
  int64_t vocab_pad_multiple = 64;          // logits/embedding rows padded up to a multiple of this
  int64_t hidden_size = 256;                // d
  int64_t num_hidden_layers = 4;            // N_layers
  int64_t num_attention_heads = 4;          // q heads
  int64_t num_key_value_heads = 4;          // kv heads (GQA), divides q heads
  int64_t head_dim = 0;                     // 0 = hidden_size / num_attention_heads
  int64_t intermediate_size = 1024;         // SwiGLU inner size
  int64_t max_position_embeddings = 1024;   // longest sequence
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;          // std of normal init of weights
  // Backbone variants of imported models (docs/model.md "Variants"; all off: the Qwen-style default).
  bool qk_norm = false;                     // Qwen3: RMSNorm over each head's head_dim of q and k before RoPE
  bool attention_bias = false;              // Qwen2: q/k/v projections carry biases (o_proj none)
  std::string rope_scaling_type = "none";   // "none" | "llama3" (Llama 3.1's frequency-dependent scaling)
  double rope_scaling_factor = 8.0;         // llama3: long wavelengths' frequencies divided by this
  double rope_scaling_low_freq_factor = 1.0;
  double rope_scaling_high_freq_factor = 4.0;
  int64_t rope_scaling_original_max_position_embeddings = 8192;
  // JTok (paper section 3.2): per selected layer a token-indexed table E (Vp x d) and a scaler s (d);
  // the MLP update becomes Delta_m * (1 + s * E[x] / (||E[x]||_2 + eps)). docs/jtok.md has the choices.
  bool jtok = false;
  std::string jtok_layers = "all";          // "all", or layer indices "0,2,5" / ranges "0-3,6"
  double jtok_eps = 1e-6;                   // the epsilon of Norm_eps
  bool jtok_norm = true;                    // false = the paper's ablation without the L2 norm (App. E.2)
  double jtok_init_std = 0.02;              // E ~ N(0, jtok_init_std)
  double jtok_scale_init = 1.0;             // s initialised to this constant
  // JTok-M (paper section 3.3): per selected layer n_e tables E_i (Vp x d), a router R (n_e x d) on the
  // attention input, top-K sigmoid mixing e = sum w_i E_i[x], and the residual injection
  // c * s * e / (||e||_2 + eps) beside the MLP update, c = 1/sqrt(2 N_layers). docs/jtok.md has the choices.
  bool jtokm = false;
  std::string jtokm_layers = "all";         // same syntax as jtok_layers
  int64_t jtokm_n_e = 5;                    // tables per layer
  int64_t jtokm_top_k = 2;                  // K tables mixed per token
  double jtokm_aux_loss_coef = 1e-4;        // lambda of the load-balancing loss (App. D)
  double jtokm_eps = 1e-6;
  bool jtokm_norm = true;                   // false = ablation without the L2 norm (App. E.2)
  bool jtokm_depth_scaling = true;          // false = ablation without 1/sqrt(2 N_layers) (App. E.1)
  double jtokm_init_std = 0.02;             // E_i ~ N(0, jtokm_init_std)
  double jtokm_scale_init = 1.0;            // s initialised to this constant
  // MoE (model_type "jtok_moe", DeepSeek's field names): layers >= first_k_dense_replace replace the
  // MLP by shared experts + top-k of n_routed_experts routed experts, each a SwiGLU of
  // moe_intermediate_size (n_shared_experts > 1: one SwiGLU of n_shared * moe_intermediate_size).
  int64_t first_k_dense_replace = 1;        // the first k layers keep the dense MLP (intermediate_size)
  int64_t n_routed_experts = 8;
  int64_t n_shared_experts = 1;             // 0 = none
  int64_t num_experts_per_tok = 2;          // top-k
  int64_t moe_intermediate_size = 256;      // each expert's SwiGLU inner size
  double router_aux_loss_coef = 0.001;      // switch-style load-balancing loss coefficient (0 = off)
  bool norm_topk_prob = false;              // renormalise the top-k softmax probabilities to sum 1
  std::string mlp_only_layers;              // Qwen3-MoE: layers that keep the dense MLP ("" = none; jtok_layers syntax)
  int64_t decoder_sparse_step = 1;          // Qwen3-MoE: MoE only on layers l with (l + 1) % step == 0

  int64_t padded_vocab() const { return (vocab_size + vocab_pad_multiple - 1) / vocab_pad_multiple * vocab_pad_multiple; }
  int64_t hd() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  int64_t q_dim() const { return num_attention_heads * hd(); }
  // Whether layer l carries a JTok table (parses jtok_layers; validated at load).
  bool jtok_on_layer(int64_t l) const;
  int64_t jtok_num_layers() const;
  bool jtokm_on_layer(int64_t l) const;
  int64_t jtokm_num_layers() const;
  int64_t kv_dim() const { return num_key_value_heads * hd(); }
  bool is_moe() const { return model_type == "jtok_moe"; }
  // Whether layer l has an MoE block instead of the dense MLP.
  bool moe_on_layer(int64_t l) const;
  int64_t moe_num_layers() const;
  int64_t shared_intermediate() const { return n_shared_experts * moe_intermediate_size; }
};

// "all", "none" / "", or comma-separated layer indices and ranges ("0,2,5-7") over n layers: which
// layers are on. Throws on bad syntax or a layer outside 0..n-1.
std::vector<bool> parse_layer_set(const std::string& spec, int64_t n);

}  // namespace jtok
