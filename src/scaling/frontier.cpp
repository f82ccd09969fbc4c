#include "scaling/frontier.h"

#include <cmath>

#include "core/error.h"

namespace jtok {

namespace {
void log_axes(const std::vector<double>& compute, const std::vector<double>& loss, std::vector<double>& x,
              std::vector<double>& y) {
  JTOK_CHECK(compute.size() == loss.size());
  x.resize(compute.size()), y.resize(loss.size());
  for (size_t i = 0; i < compute.size(); ++i) {
    if (!(compute[i] > 0) || !(loss[i] > 0))
      fail("frontier fit: point ", i + 1, " has non-positive compute or loss (", compute[i], ", ", loss[i], ")");
    x[i] = std::log10(compute[i]);
    y[i] = std::log2(loss[i]);
  }
}
}  // namespace

FrontierFit fit_frontier(const std::vector<double>& compute, const std::vector<double>& loss) {
  if (compute.size() < 3) fail("frontier fit needs at least 3 points, got ", compute.size());
  std::vector<double> x, y;
  log_axes(compute, loss, x, y);
  LineFit l = fit_line(x, y);
  return {l.slope, l.intercept, l.r2, l.n};
}

double compute_saving(double alpha, double beta_base, double beta_other) {
  return 1.0 - std::pow(10.0, (beta_base - beta_other) / alpha);
}

FrontierComparison compare_frontiers(const std::vector<std::vector<double>>& computes,
                                     const std::vector<std::vector<double>>& losses) {
  JTOK_CHECK(computes.size() == losses.size() && !computes.empty());
  FrontierComparison out;
  std::vector<std::vector<double>> xs(computes.size()), ys(computes.size());
  for (size_t k = 0; k < computes.size(); ++k) {
    out.separate.push_back(fit_frontier(computes[k], losses[k]));
    log_axes(computes[k], losses[k], xs[k], ys[k]);
  }
  out.saving_separate.assign(computes.size(), 0.0);
  out.saving_shared_slope.assign(computes.size(), 0.0);
  if (computes.size() < 2) return out;
  out.shared = fit_shared_slope(xs, ys);
  const auto& base = out.separate[0];
  for (size_t k = 1; k < computes.size(); ++k) {
    out.saving_separate[k] = compute_saving(base.alpha, base.beta, out.separate[k].beta);
    out.saving_shared_slope[k] = compute_saving(out.shared.slope, out.shared.intercepts[0], out.shared.intercepts[k]);
  }
  return out;
}

LineFit fit_eta(const std::vector<double>& eta, const std::vector<double>& loss) {
  JTOK_CHECK(eta.size() == loss.size());
  if (eta.size() < 3) fail("eta fit needs at least 3 points, got ", eta.size());
  std::vector<double> x(eta.size());
  for (size_t i = 0; i < eta.size(); ++i) {
    if (!(eta[i] > 0)) fail("eta fit: point ", i + 1, " has non-positive eta ", eta[i]);
    x[i] = std::log2(eta[i]);
  }
  return fit_line(x, loss);
}

}  // namespace jtok
