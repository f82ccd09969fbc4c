// A Hugging Face tokenizer.json checked against what jtok's tokenizer implements, before an import
// copies it into the checkpoint (the checkpoint's tokenizer is then the model's own).
#pragma once
#include <string>

namespace jtok {

// The TrainConfig.tokenizer kind that reads `dir`/tokenizer.json exactly ("qwen3": byte-level BPE
// with Qwen2's split pattern, NFC), after loading it with that kind; errors name the file and what
// it says that jtok does not implement (another pre_tokenizer, normalizer or model type).
std::string hf_tokenizer_kind(const std::string& dir);

}  // namespace jtok
