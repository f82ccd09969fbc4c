// A Hugging Face tokenizer.json checked against what jtok's tokenizer implements, before an import
// copies it into the checkpoint (the checkpoint's tokenizer is then the model's own).
#pragma once
#include <cstdint>
#include <string>

namespace jtok {

// The TrainConfig.tokenizer kind that reads `dir`/tokenizer.json exactly, after loading it with that
// kind: "qwen3" (byte-level BPE, Qwen2's split pattern, NFC: Qwen2 and Qwen3) or "llama3" (Llama 3's
// pattern, no normalizer). Errors name the file and what it says that jtok does not implement
// (another pre_tokenizer, normalizer or model type, no end-of-text token).
// model_vocab > 0: a tokenizer with more ids than that (the model's embedding rows) is refused too.
std::string hf_tokenizer_kind(const std::string& dir, int64_t model_vocab = 0);

}  // namespace jtok
