#include "export/gguf_export.h"

#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_int.h"
#include "data/tokenizer.h"
#include "export/gguf_vocab.h"
#include "model/moe.h"
#include "ops/rope.h"

namespace jtok {

namespace fs = std::filesystem;

// llama.cpp's qwen3moe: every layer MoE, softmax router, top-k weights always renormalised
// (norm_w hard-wired true), no shared experts, q/k norms, no biases, plain RoPE.
std::string qwen3moe_unsupported_reason(const ModelConfig& c) {
  if (!c.qk_norm) return "it has no qk_norm (qwen3moe has q/k norms)";
  if (c.attention_bias) return "it has attention_bias";
  if (c.n_shared_experts != 0) return "it has shared experts (n_shared_experts " + std::to_string(c.n_shared_experts) + ")";
  if (!c.norm_topk_prob) return "norm_topk_prob is false (llama.cpp always renormalises the top-k weights)";
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (!c.moe_on_layer(l))
      return "layer " + std::to_string(l) + " keeps a dense MLP (first_k_dense_replace, mlp_only_layers or "
             "decoder_sparse_step; qwen3moe makes every layer MoE)";
  if (c.rope_scaling_type != "none") return "it has llama3 rope scaling";
  return "";
}

std::string gguf_unsupported_reason(const ModelConfig& c) {
  if (c.jtok || c.jtokm)
    return "the model has token-indexed tables (JTok / JTok-M): llama.cpp has no such module, so a GGUF "
           "file could not run it; serve it with `jtok serve` (or `jtok generate`) instead";
  if (c.is_moe()) {
    if (std::string why = qwen3moe_unsupported_reason(c); !why.empty())
      return "the model is an MoE that llama.cpp's `qwen3moe` architecture (the only one written here for an "
             "MoE) cannot express: " + why + "; serve it with `jtok serve` (or `jtok generate`) instead";
  }
  if (c.hd() % 2 != 0) return "head_dim is odd: RoPE needs pairs";
  if (c.qk_norm && c.attention_bias)
    return "the model has both qk_norm and attention_bias: no llama.cpp architecture has both (qwen3 has the "
           "q/k norm, qwen2 the biases); serve it with `jtok serve` (or `jtok generate`) instead";
  if (c.rope_scaling_type != "none" && (c.qk_norm || c.attention_bias))
    return "the model has llama3 rope scaling with qk_norm or attention_bias: llama.cpp's qwen2 / qwen3 "
           "architectures take no per-frequency rope factors; serve it with `jtok serve` instead";
  return "";
}

std::string gguf_architecture(const ModelConfig& c) {
  if (c.is_moe()) return "qwen3moe";
  if (c.qk_norm) return "qwen3";
  if (c.attention_bias) return "qwen2";
  return "llama";
}

std::vector<float> permute_rope_rows(const float* w, int64_t n_heads, int64_t hd, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(n_heads * hd * cols));
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t j = 0; j < half; ++j)
      for (int64_t s = 0; s < 2; ++s) {
        const float* src = w + (h * hd + s * half + j) * cols;
        std::copy(src, src + cols, out.begin() + (h * hd + 2 * j + s) * cols);
      }
  return out;
}

namespace {

// The architecture's hyper-parameters under "<arch>." and the tokenizer.
void add_gguf_metadata(const ModelConfig& c, const std::string& arch, const GgufVocab& voc, const GgufExportOptions& opt,
                       GgufWriter& w) {
  const std::string a = arch + ".";
  const auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  w.add_string("general.architecture", arch);
  w.add_string("general.name", opt.name.empty() ? "jtok" : opt.name);
  // llama_ftype: ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q8_0 7.
  w.add_u32("general.file_type", opt.dtype == GgmlType::F32 ? 0 : opt.dtype == GgmlType::F16 ? 1 : 7);
  w.add_u32(a + "context_length", u32(c.max_position_embeddings));
  w.add_u32(a + "embedding_length", u32(c.hidden_size));
  w.add_u32(a + "block_count", u32(c.num_hidden_layers));
  w.add_u32(a + "feed_forward_length", u32(c.intermediate_size));
  w.add_u32(a + "attention.head_count", u32(c.num_attention_heads));
  w.add_u32(a + "attention.head_count_kv", u32(c.num_key_value_heads));
  w.add_u32(a + "attention.key_length", u32(c.hd()));
  w.add_u32(a + "attention.value_length", u32(c.hd()));
  w.add_f32(a + "rope.freq_base", static_cast<float>(c.rope_theta));
  w.add_u32(a + "rope.dimension_count", u32(c.hd()));
  w.add_f32(a + "attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w.add_u32(a + "vocab_size", u32(static_cast<int64_t>(voc.tokens.size())));
  if (c.is_moe()) {  // qwen3moe: the routed experts (their SwiGLU size; top-k renormalised by llama.cpp itself)
    w.add_u32(a + "expert_count", u32(c.n_routed_experts));
    w.add_u32(a + "expert_used_count", u32(c.num_experts_per_tok));
    w.add_u32(a + "expert_feed_forward_length", u32(c.moe_intermediate_size));
  }
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", voc.pre);
  w.add_string_array("tokenizer.ggml.tokens", voc.tokens);
  w.add_i32_array("tokenizer.ggml.token_type", voc.types);
  w.add_string_array("tokenizer.ggml.merges", voc.merges);
  w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(voc.bos));
  w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(voc.eos));
  if (voc.eot >= 0) w.add_u32("tokenizer.ggml.eot_token_id", static_cast<uint32_t>(voc.eot));
  // Explicit either way: llama.cpp's own default for "llama-bpe" is to add it.
  w.add_bool("tokenizer.ggml.add_bos_token", voc.add_bos);
  w.add_bool("tokenizer.ggml.add_eos_token", false);
}

// llama.cpp's freq_factors for Llama 3's scaling: it divides each unscaled frequency by factor i.
std::vector<float> llama3_rope_factors(const ModelConfig& c) {
  const std::vector<float> plain = rope_inv_freq(c.hd(), c.rope_theta);
  RopeScaling s{c.rope_scaling_factor, c.rope_scaling_low_freq_factor, c.rope_scaling_high_freq_factor,
                c.rope_scaling_original_max_position_embeddings};
  const std::vector<float> scaled = rope_inv_freq(c.hd(), c.rope_theta, &s);
  std::vector<float> f(plain.size());
  for (size_t i = 0; i < f.size(); ++i) f[i] = plain[i] / scaled[i];
  return f;
}

// One layer's attention tensors. llama: q / k rows in llama.cpp's pair order; qwen2 / qwen3 use
// rotate_half RoPE (NEOX) as we do, so rows stay, with the biases (qwen2) or q/k norms (qwen3).
void add_gguf_attention(const LayerView& L, const ModelConfig& c, const std::string& arch, const std::string& p,
                        GgmlType wt, GgufWriter& w) {
  const int64_t d = c.hidden_size, hd = c.hd(), H = c.num_attention_heads, KV = c.num_key_value_heads;
  const GgmlType f32 = GgmlType::F32;
  if (arch == "llama") {
    w.add_tensor(p + "attn_q.weight", {H * hd, d}, wt, permute_rope_rows(L.wq, H, hd, d));
    w.add_tensor(p + "attn_k.weight", {KV * hd, d}, wt, permute_rope_rows(L.wk, KV, hd, d));
  } else {
    w.add_tensor(p + "attn_q.weight", {H * hd, d}, wt, L.wq);
    w.add_tensor(p + "attn_k.weight", {KV * hd, d}, wt, L.wk);
  }
  w.add_tensor(p + "attn_v.weight", {KV * hd, d}, wt, L.wv);
  w.add_tensor(p + "attn_output.weight", {d, H * hd}, wt, L.wo);
  if (L.bq) {
    w.add_tensor(p + "attn_q.bias", {H * hd}, f32, L.bq);
    w.add_tensor(p + "attn_k.bias", {KV * hd}, f32, L.bk);
    w.add_tensor(p + "attn_v.bias", {KV * hd}, f32, L.bv);
  }
  if (L.q_norm) {
    w.add_tensor(p + "attn_q_norm.weight", {hd}, f32, L.q_norm);
    w.add_tensor(p + "attn_k_norm.weight", {hd}, f32, L.k_norm);
  }
}

// One MoE layer as llama.cpp's qwen3moe holds it: the router (E, d) kept f32 (ours is never low
// precision), and each projection of the E experts stacked into one 3-D tensor, (E, F, d) for gate
// and up, (E, d, F) for down (ours are stored expert by expert: gate, up, down).
void add_gguf_experts(const LayerView& L, const ModelConfig& c, const std::string& p, GgmlType wt, GgufWriter& w) {
  const MoeDims m = moe_dims(c);
  const size_t n = static_cast<size_t>(m.F * m.d);
  std::vector<float> gate(n * m.E), up(n * m.E), down(n * m.E);
  for (int64_t e = 0; e < m.E; ++e) {
    std::copy(expert_gate(L.moe, m, e), expert_gate(L.moe, m, e) + n, gate.begin() + e * n);
    std::copy(expert_up(L.moe, m, e), expert_up(L.moe, m, e) + n, up.begin() + e * n);
    std::copy(expert_down(L.moe, m, e), expert_down(L.moe, m, e) + n, down.begin() + e * n);
  }
  w.add_tensor(p + "ffn_gate_inp.weight", {m.E, m.d}, GgmlType::F32, L.moe.router);
  w.add_tensor(p + "ffn_gate_exps.weight", {m.E, m.F, m.d}, wt, std::move(gate));
  w.add_tensor(p + "ffn_up_exps.weight", {m.E, m.F, m.d}, wt, std::move(up));
  w.add_tensor(p + "ffn_down_exps.weight", {m.E, m.d, m.F}, wt, std::move(down));
}

}  // namespace

void build_gguf(const Model& m, const GgufExportOptions& opt, GgufWriter& w) {
  const ModelConfig& c = m.cfg;
  if (std::string why = gguf_unsupported_reason(c); !why.empty()) fail("export gguf: ", why);
  const GgufVocab voc = gguf_vocab(opt.tokenizer, opt.tokenizer_dir, c.vocab_size);
  const int64_t V = c.vocab_size;
  const std::string arch = gguf_architecture(c);
  add_gguf_metadata(c, arch, voc, opt, w);
  // Tensors: llama.cpp's names; 2-D weights (out, in) as stored; the padded vocabulary rows
  // (>= vocab_size, never looked up and excluded from our softmax) are dropped.
  const int64_t d = c.hidden_size, I = c.intermediate_size;
  const GgmlType wt = opt.dtype, f32 = GgmlType::F32;
  w.add_tensor("token_embd.weight", {V, d}, wt, m.w.embed);
  if (c.rope_scaling_type == "llama3") w.add_tensor("rope_freqs.weight", {c.hd() / 2}, f32, llama3_rope_factors(c));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerView& L = m.w.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    w.add_tensor(p + "attn_norm.weight", {d}, f32, L.ln1);
    add_gguf_attention(L, c, arch, p, wt, w);
    w.add_tensor(p + "ffn_norm.weight", {d}, f32, L.ln2);
    if (c.is_moe()) {
      add_gguf_experts(L, c, p, wt, w);
      continue;
    }
    w.add_tensor(p + "ffn_gate.weight", {I, d}, wt, L.wg);
    w.add_tensor(p + "ffn_up.weight", {I, d}, wt, L.wu);
    w.add_tensor(p + "ffn_down.weight", {d, I}, wt, L.wd);
  }
  w.add_tensor("output_norm.weight", {d}, f32, m.w.norm);
  if (!c.tie_word_embeddings) w.add_tensor("output.weight", {V, d}, wt, m.w.lm_head);
}

}  // namespace jtok
