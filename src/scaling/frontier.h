// Log-linear fits of the paper: efficient frontiers (Appendix C) and loss against eta (Fig. 7b).
//
// Frontier: log2 L = alpha * log10 C + beta (alpha < 0). Compute saving of frontier "other"
// against "base" at equal loss: C_other / C_base = 10^((beta_base - beta_other) / alpha), and
// saving = 1 - that ratio. With separate fits the paper uses alpha = alpha_base; with a shared
// slope alpha is the common slope.
#pragma once
#include <string>
#include <vector>
#include "scaling/lstsq.h"

namespace jtok {

struct FrontierFit {
  double alpha = 0, beta = 0, r2 = 0;
  int n = 0;
};
// compute (FLOPs) and loss, all positive; at least 3 points.
FrontierFit fit_frontier(const std::vector<double>& compute, const std::vector<double>& loss);

// 1 - 10^((beta_base - beta_other) / alpha): the fraction of compute saved by "other".
double compute_saving(double alpha, double beta_base, double beta_other);

struct FrontierComparison {
  std::vector<FrontierFit> separate;  // one per frontier, the first is the base
  SharedSlopeFit shared;              // in the same log2/log10 axes
  // Per frontier k >= 1 (index 0 is the base, value 0): savings against the base.
  std::vector<double> saving_separate;      // alpha_base and separately fitted intercepts
  std::vector<double> saving_shared_slope;  // the shared slope and its intercepts
};
FrontierComparison compare_frontiers(const std::vector<std::vector<double>>& computes,
                                     const std::vector<std::vector<double>>& losses);

// Loss against the token-indexed expansion ratio: L = slope * log2(eta) + intercept.
// slope is the loss change per doubling of eta (the paper reports about -0.0118).
LineFit fit_eta(const std::vector<double>& eta, const std::vector<double>& loss);

}  // namespace jtok
