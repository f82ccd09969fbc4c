#include "scaling/lstsq.h"

#include <cmath>

#include "core/error.h"

namespace jtok {

std::vector<double> lstsq(std::vector<double> A, int m, int n, std::vector<double> y) {
  JTOK_CHECK(m >= n && n > 0 && (int)A.size() == m * n && (int)y.size() == m);
  auto at = [&](int i, int j) -> double& { return A[i * n + j]; };
  double scale = 0;
  for (double v : A) scale = std::max(scale, std::fabs(v));
  // Householder QR: for each column k, reflect rows k..m-1 so column k below the diagonal is 0,
  // applying the same reflection to y. Then back-substitute R x = (Q^T y)[0:n].
  for (int k = 0; k < n; ++k) {
    double norm = 0;
    for (int i = k; i < m; ++i) norm += at(i, k) * at(i, k);
    norm = std::sqrt(norm);
    if (norm <= 1e-12 * std::max(scale, 1e-300)) fail("least squares: the design matrix is rank deficient (column ", k, ")");
    double alpha = at(k, k) > 0 ? -norm : norm;
    std::vector<double> v(m - k);
    for (int i = k; i < m; ++i) v[i - k] = at(i, k);
    v[0] -= alpha;
    double vnorm2 = 0;
    for (double e : v) vnorm2 += e * e;
    if (vnorm2 == 0) continue;
    for (int j = k; j < n; ++j) {
      double dot = 0;
      for (int i = k; i < m; ++i) dot += v[i - k] * at(i, j);
      double f = 2 * dot / vnorm2;
      for (int i = k; i < m; ++i) at(i, j) -= f * v[i - k];
    }
    double dot = 0;
    for (int i = k; i < m; ++i) dot += v[i - k] * y[i];
    double f = 2 * dot / vnorm2;
    for (int i = k; i < m; ++i) y[i] -= f * v[i - k];
  }
  std::vector<double> x(n);
  for (int k = n - 1; k >= 0; --k) {
    double s = y[k];
    for (int j = k + 1; j < n; ++j) s -= at(k, j) * x[j];
    x[k] = s / at(k, k);
  }
  return x;
}

double r_squared(const std::vector<double>& y, const std::vector<double>& pred) {
  double mean = 0;
  for (double v : y) mean += v;
  mean /= double(y.size());
  double ss_res = 0, ss_tot = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    ss_res += (y[i] - pred[i]) * (y[i] - pred[i]);
    ss_tot += (y[i] - mean) * (y[i] - mean);
  }
  return ss_tot > 0 ? 1 - ss_res / ss_tot : (ss_res == 0 ? 1.0 : 0.0);
}

LineFit fit_line(const std::vector<double>& x, const std::vector<double>& y) {
  JTOK_CHECK(x.size() == y.size());
  const int m = (int)x.size();
  if (m < 2) fail("line fit needs at least 2 points, got ", m);
  std::vector<double> A(2 * m);
  for (int i = 0; i < m; ++i) A[2 * i] = x[i], A[2 * i + 1] = 1;
  auto c = lstsq(A, m, 2, y);
  LineFit f{c[0], c[1], 0, m};
  std::vector<double> pred(m);
  for (int i = 0; i < m; ++i) pred[i] = f.slope * x[i] + f.intercept;
  f.r2 = r_squared(y, pred);
  return f;
}

QuadFit fit_quadratic(const std::vector<double>& x, const std::vector<double>& y) {
  JTOK_CHECK(x.size() == y.size());
  const int m = (int)x.size();
  if (m < 3) fail("quadratic fit needs at least 3 points, got ", m);
  // Centre x first: x ~ 20 (log10 N) makes x^2, x, 1 nearly collinear otherwise.
  double mean = 0;
  for (double v : x) mean += v;
  mean /= m;
  std::vector<double> A(3 * m);
  for (int i = 0; i < m; ++i) {
    double u = x[i] - mean;
    A[3 * i] = u * u, A[3 * i + 1] = u, A[3 * i + 2] = 1;
  }
  auto c = lstsq(A, m, 3, y);
  // Back to powers of x: a (x-m)^2 + b (x-m) + c.
  QuadFit f;
  f.a = c[0];
  f.b = c[1] - 2 * c[0] * mean;
  f.c = c[0] * mean * mean - c[1] * mean + c[2];
  std::vector<double> pred(m);
  for (int i = 0; i < m; ++i) {
    double u = x[i] - mean;
    pred[i] = (c[0] * u + c[1]) * u + c[2];
  }
  f.r2 = r_squared(y, pred);
  return f;
}

SharedSlopeFit fit_shared_slope(const std::vector<std::vector<double>>& xs, const std::vector<std::vector<double>>& ys) {
  JTOK_CHECK(xs.size() == ys.size() && !xs.empty());
  const int g = (int)xs.size();
  int m = 0;
  for (int k = 0; k < g; ++k) {
    JTOK_CHECK(xs[k].size() == ys[k].size());
    m += (int)xs[k].size();
  }
  // Columns: [x, 1{group 0}, ..., 1{group g-1}].
  const int n = 1 + g;
  if (m < n + 1) fail("shared-slope fit needs at least ", n + 1, " points, got ", m);
  std::vector<double> A(size_t(m) * n, 0.0), y(m);
  int r = 0;
  for (int k = 0; k < g; ++k)
    for (size_t i = 0; i < xs[k].size(); ++i, ++r) {
      A[size_t(r) * n] = xs[k][i];
      A[size_t(r) * n + 1 + k] = 1;
      y[r] = ys[k][i];
    }
  auto c = lstsq(A, m, n, y);
  SharedSlopeFit f;
  f.slope = c[0];
  f.intercepts.assign(c.begin() + 1, c.end());
  std::vector<double> pred(m);
  r = 0;
  for (int k = 0; k < g; ++k)
    for (size_t i = 0; i < xs[k].size(); ++i, ++r) pred[r] = f.slope * xs[k][i] + f.intercepts[k];
  f.r2 = r_squared(y, pred);
  return f;
}

}  // namespace jtok
