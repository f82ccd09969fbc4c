#include "infer/logit_compare.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace jtok {

// log-softmax of x (V) into out (double), returns the argmax (first on ties).
static int64_t log_softmax(double* out, const float* x, int64_t V) {
  int64_t arg = 0;
  for (int64_t v = 1; v < V; ++v)
    if (x[v] > x[arg]) arg = v;
  const double mx = x[arg];
  double s = 0;
  for (int64_t v = 0; v < V; ++v) s += std::exp(static_cast<double>(x[v]) - mx);
  const double lse = mx + std::log(s);
  for (int64_t v = 0; v < V; ++v) out[v] = static_cast<double>(x[v]) - lse;
  return arg;
}

void compare_logits(LogitComparison& acc, const float* logits, const float* ref_logits, const int32_t* targets,
                    int64_t N, int64_t V, int64_t ld) {
  JTOK_CHECK(V > 0 && ld >= V, "compare_logits: V ", V, ", row stride ", ld);
  for (int64_t n = 0; n < N; ++n)
    JTOK_CHECK(targets[n] >= 0 && targets[n] < V, "compare_logits: target ", targets[n], " at position ", n,
               " outside the vocabulary of ", V);
  std::vector<double> kl(static_cast<size_t>(N)), dlp(static_cast<size_t>(N));
  std::vector<char> same(static_cast<size_t>(N));
#pragma omp parallel
  {
    std::vector<double> lp(static_cast<size_t>(V)), lq(static_cast<size_t>(V));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t ap = log_softmax(lp.data(), logits + n * ld, V);
      const int64_t aq = log_softmax(lq.data(), ref_logits + n * ld, V);
      double k = 0;
      for (int64_t v = 0; v < V; ++v) k += std::exp(lq[v]) * (lq[v] - lp[v]);
      kl[n] = std::max(k, 0.0);  // rounding can leave -1e-17 for equal rows
      same[n] = ap == aq;
      dlp[n] = lp[targets[n]] - lq[targets[n]];
    }
  }
  for (int64_t n = 0; n < N; ++n) {  // in order: the sums do not depend on the thread count
    acc.positions += 1;
    acc.top1_same += same[n];
    acc.kl_sum += kl[n];
    acc.kl_max = std::max(acc.kl_max, kl[n]);
    acc.dlogp_sum += dlp[n];
    acc.dlogp_abs_sum += std::fabs(dlp[n]);
    acc.dlogp_abs_max = std::max(acc.dlogp_abs_max, std::fabs(dlp[n]));
  }
}

}  // namespace jtok
