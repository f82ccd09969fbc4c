#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"

#include "core/profile.h"
#include "ops/adamw.h"
#include "train/schedule.h"

namespace jtok {

AdamWState make_adamw_state(const Model& model) {
  AdamWState s;
  s.m.assign(model.params.size(), 0.0f);
  s.v.assign(model.params.size(), 0.0f);
  s.table_m.resize(model.tables.size());
  s.table_v.resize(model.tables.size());
  for (size_t k = 0; k < model.tables.size(); ++k) {
    s.table_m[k].assign(model.tables[k].w.size(), 0.0f);
    s.table_v[k].assign(model.tables[k].w.size(), 0.0f);
  }
  return s;
}

double grad_global_norm(const Model& model) {
  const float* g = model.grads.data();
  const int64_t n = static_cast<int64_t>(model.grads.size());
  // Blocks of 4096 elements: a float partial per block (vectorizes), blocks summed in double.
  const int64_t blocks = (n + 4095) / 4096;
  double ss = parallel_sum(blocks, [&](int64_t b) {
    const int64_t lo = b * 4096, hi = std::min(n, lo + 4096);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = lo; i < hi; ++i) s += g[i] * g[i];
    return static_cast<double>(s);
  });
  for (const auto& tg : model.table_grads) ss += tg.sum_squares();
  return std::sqrt(ss);
}

StepStats optimizer_step(Model& model, AdamWState& state, const TrainConfig& t) {
  JTOK_PROFILE("optimizer");
  StepStats st;
  st.grad_norm = grad_global_norm(model);
  st.clip_coef = 1.0;
  if (t.max_grad_norm > 0) {
    // As torch.nn.utils.clip_grad_norm_: coef computed in fp32 from the norm.
    float coef = static_cast<float>(t.max_grad_norm) / (static_cast<float>(st.grad_norm) + 1e-6f);
    if (coef < 1.0f) st.clip_coef = coef;
  }
  st.lr = lr_at(t, state.step);
  state.step += 1;
  for (const auto& p : model.layout) {
    AdamWHyper h{static_cast<float>(st.lr), static_cast<float>(t.adam_beta1), static_cast<float>(t.adam_beta2),
                 static_cast<float>(t.adam_epsilon), p.decay ? static_cast<float>(t.weight_decay) : 0.0f, state.step,
                 static_cast<float>(st.clip_coef)};
    adamw_update(model.params.data() + p.offset, model.grads.data() + p.offset, state.m.data() + p.offset,
                 state.v.data() + p.offset, p.numel, h);
  }
  // Token-indexed tables: 2-D weights, so weight decay applies, as in the reference's decay group.
  for (size_t l = 0; l < model.tables.size(); ++l) {
    JTOK_PROFILE("optimizer_tables");
    AdamWHyper h{static_cast<float>(st.lr), static_cast<float>(t.adam_beta1), static_cast<float>(t.adam_beta2),
                 static_cast<float>(t.adam_epsilon), static_cast<float>(t.weight_decay), state.step,
                 static_cast<float>(st.clip_coef)};
    if (t.table_optimizer == "sparse")
      table_adamw_sparse_rows(model.tables[l], state.table_m[l].data(), state.table_v[l].data(), model.table_grads[l], h);
    else
      table_adamw_dense_semantics(model.tables[l], state.table_m[l].data(), state.table_v[l].data(),
                                  model.table_grads[l], h);
  }
  return st;
}

}  // namespace jtok
