// Which parameters train: all of them, or, with Model::backbone_frozen (`jtok train --train-only
// tables`), only the token-indexed modules: JTok / JTok-M tables, their scalers and JTok-M routers.
// A frozen tensor gets no weight-gradient product in the backward (its gradient pointer is null in
// the view backward() writes through, so linear_backward skips the dweight GEMM), no optimizer
// update and no AdamW moments; input gradients still flow through it.
#pragma once
#include <string>

#include "model/transformer.h"

namespace jtok {

// A JTok / JTok-M parameter of the flat layout (model.layers.{l}.jtok.scale, .jtokm.router.weight,
// .jtokm.scale) by its name; the tables themselves live in Model::tables.
bool is_token_indexed_param(const std::string& name);
// Whether parameter p of m trains (gets a gradient, an AdamW update and moments).
bool param_trainable(const Model& m, const ParamInfo& p);
// View `all` (bound to any buffer in m's layout: m.w, m.g, a device copy's) with every frozen
// tensor's pointer null.
ModelView trainable_view(const Model& m, const ModelView& all);
// The gradient view backward() writes through: trainable_view(m, m.g).
ModelView trainable_grad_view(const Model& m);

}  // namespace jtok
