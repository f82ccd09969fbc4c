#include "infer/validation.h"

namespace jtok {

ValidationSums validation_sums(const Model& m, const Model* ref, const ValidationSet& val, int64_t nb) {
  const ModelConfig& mc = m.cfg;
  Activations acts, ref_acts;
  ValidationSums s;
  for (int64_t i = 0; i < nb; ++i) {
    Batch b = val.batch(static_cast<size_t>(i));
    forward(m, acts, b.inputs.data(), b.B, b.T);
    s.loss_sum += loss_of_logits(m, acts, b.targets.data());
    if (ref) {
      forward(*ref, ref_acts, b.inputs.data(), b.B, b.T);
      s.ref_loss_sum += loss_of_logits(*ref, ref_acts, b.targets.data());
      compare_logits(s.cmp, acts.logits.data(), ref_acts.logits.data(), b.targets.data(), b.B * b.T,
                     mc.vocab_size, mc.padded_vocab());
    }
  }
  return s;
}

}  // namespace jtok
