#include "scaling/kaplan.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "scaling/lstsq.h"

namespace jtok {

namespace {

// ln L and its gradient wrt theta = (lnA, lnB, alpha, beta) at one point (lnN, lnD).
// With u = (alpha/beta)(lnA - lnN), v = lnB - lnD, s = logsumexp(u, v), ln L = beta * s and
//   d/dlnA = alpha * wu,  d/dlnB = beta * wv,  d/dalpha = wu (lnA - lnN),  d/dbeta = s - wu u
// where wu = e^u / (e^u + e^v), wv = 1 - wu.
double log_loss(const double* th, double ln_n, double ln_d, double* grad) {
  const double la = th[0], lb = th[1], al = th[2], be = th[3];
  const double u = (al / be) * (la - ln_n), v = lb - ln_d;
  const double mx = std::max(u, v);
  const double eu = std::exp(u - mx), ev = std::exp(v - mx);
  const double s = mx + std::log(eu + ev);
  const double wu = eu / (eu + ev), wv = 1 - wu;
  if (grad) {
    grad[0] = al * wu;
    grad[1] = be * wv;
    grad[2] = wu * (la - ln_n);
    grad[3] = s - wu * u;
  }
  return be * s;
}

struct Problem {
  std::vector<double> ln_n, ln_d, ln_l;
  double cost(const double* th) const {
    if (!(th[2] > 0) || !(th[3] > 0)) return std::numeric_limits<double>::infinity();
    double c = 0;
    for (size_t i = 0; i < ln_n.size(); ++i) {
      double r = log_loss(th, ln_n[i], ln_d[i], nullptr) - ln_l[i];
      c += r * r;
    }
    return std::isfinite(c) ? c : std::numeric_limits<double>::infinity();
  }
};

// Levenberg-Marquardt from th; returns the final cost, updates th and iterations.
double levenberg_marquardt(const Problem& pb, double* th, int* iterations) {
  const int m = (int)pb.ln_n.size(), P = 4;
  double lambda = 1e-3, cost = pb.cost(th);
  int it = 0;
  for (; it < 300 && std::isfinite(cost); ++it) {
    // J (m, 4) and r (m); the step solves min ||J delta + r||^2 + lambda ||diag(J^T J)^(1/2) delta||^2,
    // written as one stacked least-squares problem.
    std::vector<double> J(size_t(m) * P), r(m), diag(P, 0.0);
    for (int i = 0; i < m; ++i) {
      r[i] = log_loss(th, pb.ln_n[i], pb.ln_d[i], &J[size_t(i) * P]) - pb.ln_l[i];
      for (int j = 0; j < P; ++j) diag[j] += J[size_t(i) * P + j] * J[size_t(i) * P + j];
    }
    bool improved = false;
    while (lambda < 1e12) {
      std::vector<double> A(J), b(m + P, 0.0);
      A.resize(size_t(m + P) * P, 0.0);
      for (int i = 0; i < m; ++i) b[i] = -r[i];
      for (int j = 0; j < P; ++j) A[size_t(m + j) * P + j] = std::sqrt(lambda * std::max(diag[j], 1e-12));
      std::vector<double> delta;
      try {
        delta = lstsq(A, m + P, P, b);
      } catch (const Error&) {
        lambda *= 10;
        continue;
      }
      double trial[4];
      for (int j = 0; j < P; ++j) trial[j] = th[j] + delta[j];
      double c = pb.cost(trial);
      if (c < cost) {
        double rel = (cost - c) / std::max(cost, 1e-300);
        for (int j = 0; j < P; ++j) th[j] = trial[j];
        cost = c;
        lambda = std::max(lambda / 10, 1e-12);
        improved = true;
        if (rel < 1e-15 || cost < 1e-28) lambda = 1e13;  // converged: stop the outer loop below
        break;
      }
      lambda *= 10;
    }
    if (!improved || lambda > 1e12) break;
  }
  *iterations = it;
  return cost;
}

}  // namespace

double KaplanParams::loss(double n, double d) const {
  return std::pow(std::pow(A / n, alpha / beta) + B / d, beta);
}

KaplanFit fit_kaplan(const std::vector<double>& n, const std::vector<double>& d, const std::vector<double>& loss) {
  JTOK_CHECK(n.size() == d.size() && n.size() == loss.size());
  if (n.size() < 6) fail("Kaplan fit needs at least 6 points (4 parameters), got ", n.size());
  Problem pb;
  for (size_t i = 0; i < n.size(); ++i) {
    if (!(n[i] > 0) || !(d[i] > 0) || !(loss[i] > 0))
      fail("Kaplan fit: point ", i + 1, " has non-positive N, D or loss (", n[i], ", ", d[i], ", ", loss[i], ")");
    pb.ln_n.push_back(std::log(n[i]));
    pb.ln_d.push_back(std::log(d[i]));
    pb.ln_l.push_back(std::log(loss[i]));
  }
  // Multi-start: exponents from small to large, A and B over many decades.
  KaplanFit best;
  double best_cost = std::numeric_limits<double>::infinity();
  for (double al : {0.05, 0.15, 0.4, 1.0})
    for (double be : {0.05, 0.15, 0.4, 1.0})
      for (double la10 : {4.0, 8.0, 12.0, 16.0})
        for (double lb10 : {4.0, 8.0, 12.0, 16.0}) {
          double th[4] = {la10 * std::log(10.0), lb10 * std::log(10.0), al, be};
          int its = 0;
          double c = levenberg_marquardt(pb, th, &its);
          if (c < best_cost) {
            best_cost = c;
            best.p = {std::exp(th[0]), std::exp(th[1]), th[2], th[3]};
            best.iterations = its;
          }
        }
  if (!std::isfinite(best_cost)) fail("Kaplan fit did not converge from any starting point");
  best.n = (int)n.size();
  best.rmse_log = std::sqrt(best_cost / double(n.size()));
  std::vector<double> pred(n.size());
  for (size_t i = 0; i < n.size(); ++i) pred[i] = std::log(best.p.loss(n[i], d[i]));
  best.r2 = r_squared(pb.ln_l, pred);
  return best;
}

}  // namespace jtok
