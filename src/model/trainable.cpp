#include "model/trainable.h"

namespace jtok {

bool is_token_indexed_param(const std::string& name) {
  return name.find(".jtok.") != std::string::npos || name.find(".jtokm.") != std::string::npos;
}

bool param_trainable(const Model& m, const ParamInfo& p) {
  return !m.backbone_frozen || is_token_indexed_param(p.name);
}

ModelView trainable_view(const Model& m, const ModelView& all) {
  if (!m.backbone_frozen) return all;
  ModelView v;  // every backbone pointer null: embedding, final norm, lm_head, each layer's tensors
  v.embed = v.norm = v.lm_head = nullptr;
  v.layers.resize(all.layers.size());
  for (size_t l = 0; l < v.layers.size(); ++l) {
    const LayerView& g = all.layers[l];
    LayerView& f = v.layers[l];
    f.ln1 = f.wq = f.wk = f.wv = f.wo = f.ln2 = nullptr;  // the rest default to null
    f.jtok_scale = g.jtok_scale;
    f.jtokm_router = g.jtokm_router;
    f.jtokm_scale = g.jtokm_scale;
  }
  return v;
}

ModelView trainable_grad_view(const Model& m) { return trainable_view(m, m.g); }

}  // namespace jtok
