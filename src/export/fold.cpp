#include "export/fold.h"

#include <cmath>

#include "core/error.h"

namespace jtok {

int64_t fold_jtok(Model& m) {
  ModelConfig& c = m.cfg;
  if (!c.jtok) return 0;
  const int64_t d = c.hidden_size;
  int64_t folded = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const int k = m.jtok_table[static_cast<size_t>(l)];
    if (k < 0) continue;
    TokenTable& t = m.tables[static_cast<size_t>(k)];
    float* s = m.w.layers[static_cast<size_t>(l)].jtok_scale;
    JTOK_CHECK(s != nullptr, "JTok layer ", l, " has no scaler");
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < t.rows; ++r) {
      float* e = t.mutable_row(r);
      // The forward's Norm_eps in float (jtok_prepare), so the folded gate rounds alike.
      float ss = 0.0f;
      for (int64_t j = 0; j < d; ++j) ss += e[j] * e[j];
      const float inv = c.jtok_norm ? 1.0f / (std::sqrt(ss) + static_cast<float>(c.jtok_eps)) : 1.0f;
      for (int64_t j = 0; j < d; ++j) e[j] = s[j] * (e[j] * inv);
    }
    for (int64_t j = 0; j < d; ++j) s[j] = 1.0f;
    folded++;
  }
  c.jtok_norm = false;
  return folded;
}

}  // namespace jtok
