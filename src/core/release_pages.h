// Hands the whole pages inside a zero-filled buffer back to the kernel (madvise MADV_DONTNEED): a
// private anonymous page read after that is a fresh zero page, so the buffer still reads as zeros
// and costs no resident memory until written. Used for the fp32 slots of matrices a model holds
// in low precision (model/lowp_weights.h).
#pragma once
#include <cstdint>

namespace jtok {

// p[0..n) must be all zeros (not checked); returns the bytes released.
int64_t release_zero_pages(float* p, int64_t n);

}  // namespace jtok
