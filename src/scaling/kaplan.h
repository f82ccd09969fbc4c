// The Kaplan form of the loss (paper eq. 1), fitted by nonlinear least squares:
//   L(N, D) = [ (A / N)^(alpha / beta) + B / D ]^beta
// N = N_c (compute-intensive parameters), D = training tokens. alpha is the model-size exponent
// and beta the data exponent (Kaplan's alpha_N and alpha_D); at compute-optimality the frontier
// falls as C^-(alpha beta / (alpha + beta)) (paper Appendix A).
#pragma once
#include <vector>

namespace jtok {

struct KaplanParams {
  double A = 0, B = 0, alpha = 0, beta = 0;
  double loss(double n, double d) const;
  double frontier_exponent() const { return alpha * beta / (alpha + beta); }
};

struct KaplanFit {
  KaplanParams p;
  double rmse_log = 0;  // root mean square of ln(L_model) - ln(L) over the points
  double r2 = 0;        // of ln L
  int n = 0;
  int iterations = 0;   // Levenberg-Marquardt iterations of the winning start
};

// Fits ln L by Levenberg-Marquardt over theta = (ln A, ln B, alpha, beta), analytic Jacobian,
// from a grid of starting points (the problem is not convex); keeps the best. Needs >= 6 points,
// all positive. alpha and beta are kept positive.
KaplanFit fit_kaplan(const std::vector<double>& n, const std::vector<double>& d, const std::vector<double>& loss);

}  // namespace jtok
