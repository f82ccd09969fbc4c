// A dense jtok model as a GGUF file for llama.cpp (docs/formats.md "GGUF export"): RMSNorm, RoPE,
// GQA, SwiGLU and the GPT-2 BPE tokenizer, as llama.cpp's `llama` architecture (with Llama 3's rope
// scaling as its rope_freqs factors), `qwen2` (q/k/v biases), `qwen3` (q/k norm) or `qwen3moe`.
#pragma once
#include <string>

#include "export/gguf_writer.h"
#include "model/transformer.h"

namespace jtok {

// Why `m` cannot be exported to llama.cpp, or "" when it can.
std::string gguf_unsupported_reason(const ModelConfig& c);
// The llama.cpp architecture a model is written as: "qwen3moe" (an MoE: Qwen3-MoE's layout, every
// layer MoE without shared experts), "qwen3" (qk_norm), "qwen2" (attention_bias), else "llama".
std::string gguf_architecture(const ModelConfig& c);

// The llama.cpp row order of a q or k projection (rows = n_heads * hd, cols): within each head,
// row 2j+s of the result is row s*hd/2 + j of w (s = 0, 1; j < hd/2). Our RoPE rotates the pair
// (j, j + hd/2) (Hugging Face rotate_half), llama.cpp's `llama` RoPE rotates (2j, 2j+1) with the
// same angle; attention scores q.k are unchanged because q and k are permuted alike.
std::vector<float> permute_rope_rows(const float* w, int64_t n_heads, int64_t hd, int64_t cols);

struct GgufExportOptions {
  GgmlType dtype = GgmlType::F32;  // of the 2-D weights; norms are always F32
  std::string tokenizer = "gpt2";  // "gpt2", "qwen3" or "llama3" (export/gguf_vocab.h)
  std::string tokenizer_dir;       // empty: default_tokenizer_dir(tokenizer)
  std::string name;                // general.name
};
// Fills w with the model's metadata, tokenizer and tensors (pointing into m: keep m alive until
// w.write()). Throws jtok::Error (naming the reason) for models llama.cpp's `llama` cannot run.
void build_gguf(const Model& m, const GgufExportOptions& opt, GgufWriter& w);

}  // namespace jtok
