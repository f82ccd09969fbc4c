// Dense linear least squares, small problems (tens of rows, a handful of columns).
#pragma once
#include <vector>

namespace jtok {

// Solves min ||A x - y||_2 by Householder QR. A is (m, n) row-major with m >= n.
// Fails when A is (numerically) rank deficient. Returns x (n).
std::vector<double> lstsq(std::vector<double> A, int m, int n, std::vector<double> y);

// Coefficient of determination 1 - SS_res / SS_tot of predictions `pred` of `y`.
double r_squared(const std::vector<double>& y, const std::vector<double>& pred);

// y = slope * x + intercept.
struct LineFit {
  double slope = 0, intercept = 0, r2 = 0;
  int n = 0;
};
LineFit fit_line(const std::vector<double>& x, const std::vector<double>& y);

// y = a x^2 + b x + c.
struct QuadFit {
  double a = 0, b = 0, c = 0, r2 = 0;
  double argmin() const { return -b / (2 * a); }
  double at(double x) const { return (a * x + b) * x + c; }
};
QuadFit fit_quadratic(const std::vector<double>& x, const std::vector<double>& y);

// Several groups of points sharing one slope: y_gi = slope * x_gi + intercept_g.
struct SharedSlopeFit {
  double slope = 0;
  std::vector<double> intercepts;  // one per group
  double r2 = 0;                   // over all points together
};
SharedSlopeFit fit_shared_slope(const std::vector<std::vector<double>>& xs, const std::vector<std::vector<double>>& ys);

}  // namespace jtok
