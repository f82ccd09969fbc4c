// Inference exports of a trained model (jtok export).
//
// fold_jtok: JTok's gate 1 + s * Norm_eps(E[x]) depends on the token alone, so inference can store
// G[x] = s * Norm_eps(E[x]) (or s * E[x] for the no-norm ablation) in the table and compute
// 1 + G[x]: one row read and one multiply, no norm per token. The folded model is an ordinary
// model with jtok_norm = false and every JTok scaler s = 1; it computes the same logits to float
// rounding (tests/test_export.cpp). JTok-M cannot be folded (its rows are mixed before the norm)
// and is left as is.
#pragma once
#include "model/transformer.h"

namespace jtok {

// Folds every JTok table of m in place (the tables must be in RAM). Returns the tables folded.
int64_t fold_jtok(Model& m);

}  // namespace jtok
