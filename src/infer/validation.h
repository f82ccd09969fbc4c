// Validation loss of a model over the first batches of a validation set (`jtok eval`), and, with a
// reference model, how far its next-token distributions are from the reference's on the same
// positions (infer/logit_compare.h).
#pragma once
#include <cstdint>

#include "data/loader.h"
#include "infer/logit_compare.h"
#include "model/transformer.h"

namespace jtok {

struct ValidationSums {
  double loss_sum = 0, ref_loss_sum = 0;  // summed mean losses of the batches, of m and of ref
  LogitComparison cmp;                    // m against ref (empty without ref)
};

// Batches 0..nb-1 of val through m and (when not null) ref.
ValidationSums validation_sums(const Model& m, const Model* ref, const ValidationSet& val, int64_t nb);

}  // namespace jtok
