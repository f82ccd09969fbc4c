// Model weights <-> safetensors with Hugging Face Qwen-style names (docs/model.md).
#pragma once
#include <string>

#include "io/safetensors.h"
#include "model/transformer.h"

namespace jtok {

// Copies every parameter from f into m. Errors (naming `origin`) on a missing tensor, a wrong
// shape or dtype, or a tensor the model does not have.
void load_weights(Model& m, const StFile& f, const std::string& origin);
// All parameters (or, with prefix, e.g. "grad.", the gradients under prefixed names).
StFile weights_to_st(const Model& m, const std::vector<float>& buffer, const std::string& prefix = "");

}  // namespace jtok
