// IsoFLOP profiles (paper section 3.1.2): at each compute budget C, loss against log10 N_c is
// fitted by a quadratic near its minimum, giving N_c*(C), D*(C) = C / (6 N_c*) and L*(C).
#pragma once
#include <string>
#include <vector>
#include "scaling/lstsq.h"

namespace jtok {

struct IsoPoint {
  double budget = 0;  // nominal budget C of the profile the run belongs to (FLOPs)
  double n_c = 0;     // compute-intensive parameters
  double loss = 0;    // final held-out loss
};

struct IsoMinimum {
  double budget = 0;
  double n_c_opt = 0;     // N_c* = 10^(argmin of the quadratic in log10 N_c)
  double tokens_opt = 0;  // D* = C / (6 N_c*)
  double loss_opt = 0;    // L* = the quadratic's minimum value
  QuadFit quad;           // loss = a u^2 + b u + c, u = log10 N_c
  int n_points = 0;       // points used in the fit
  bool extrapolated = false;  // argmin outside the fitted points' range of N_c
  // "quadratic", or "lowest_run" when the profile is not U-shaped (the quadratic opens downwards,
  // as in a short real study where the smallest model still wins): then N_c* and L* are those of
  // the run with the lowest loss, and extrapolated says whether it is at an end of the range.
  std::string method = "quadratic";
};

// Groups points by budget (exact equality), ascending. window = 0 uses every point of a budget;
// window = k >= 3 uses the k points nearest (in log N_c) to the lowest-loss point.
// Fails when a budget has fewer than 3 points; a quadratic that opens downwards falls back to
// the lowest run (method "lowest_run"), so one bad profile does not sink a whole study.
std::vector<IsoMinimum> fit_isoflops(const std::vector<IsoPoint>& points, int window = 0);

}  // namespace jtok
