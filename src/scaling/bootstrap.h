// Bootstrap interval of the isoFLOPs compute saving over runs (the paper's Figure 6a /
// Appendix C): each replicate resamples the runs of every budget's profile of every variant,
// refits the profiles' minima (fit_isoflops), both frontiers and the savings (compare_frontiers),
// exactly as the point estimate does; the interval is the percentiles of the replicates.
//
// Methods:
//   "cases"     - the runs of each profile drawn with replacement (pairs bootstrap). A draw with
//                 fewer than 3 distinct N_c cannot carry a quadratic and is drawn again (counted
//                 in `redraws`; a profile of 3 runs is thus resampled only among its 3-distinct
//                 draws, i.e. unchanged).
//   "residuals" - N_c kept, each profile's loss = its quadratic (all runs) + residuals drawn with
//                 replacement from that profile, scaled by sqrt(n / (n - 3)) for the 3 fitted
//                 parameters (fixed-design bootstrap; needs >= 4 runs per profile).
// Random numbers: std::mt19937_64 (its output is fixed by the C++ standard) and index = draw % n,
// so a seed gives the same replicates on every standard library.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "scaling/isoflops.h"

namespace jtok {

struct BootstrapOptions {
  int replicates = 1000;
  uint64_t seed = 1;
  std::string method = "cases";  // "cases" | "residuals"
  int window = 0;                // as fit_isoflops's window
  double level = 0.95;           // central interval
};

struct Percentiles {
  double lo = 0, median = 0, hi = 0;  // (1-level)/2, 0.5, (1+level)/2 quantiles (linear interpolation)
};

struct SavingBootstrap {
  int replicates = 0;
  int64_t redraws = 0;             // "cases": draws rejected for fewer than 3 distinct N_c
  int lowest_run_replicates = 0;   // replicates in which some profile fell back to its lowest run
  int extrapolated_replicates = 0; // replicates in which some minimum lay outside its profile's N_c range
  // Resamples whose refit failed (a quadratic's minimum at a non-positive loss, far outside the
  // data, cannot go on a log axis): dropped and drawn again; more than 10 x replicates fail.
  int64_t failed_resamples = 0;
  // Per variant k (index 0 is the base; its savings are 0): every replicate's value, and percentiles.
  std::vector<std::vector<double>> saving_separate, saving_shared_slope, alpha;
  std::vector<Percentiles> separate, shared_slope, alpha_pct;
};

// variants[k]: the runs of variant k (budget, n_c, loss); variant 0 is the base. Each variant
// needs at least 3 budgets, and every profile at least 3 distinct N_c.
SavingBootstrap bootstrap_saving(const std::vector<std::vector<IsoPoint>>& variants, const BootstrapOptions& opt);

// Quantile q in [0, 1] of v (sorted copy, linear interpolation between order statistics).
double quantile(std::vector<double> v, double q);

}  // namespace jtok
