#include "scaling/isoflops.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"

namespace jtok {

std::vector<IsoMinimum> fit_isoflops(const std::vector<IsoPoint>& points, int window) {
  if (window != 0 && window < 3) fail("isoFLOP window must be 0 (all points) or >= 3, got ", window);
  std::map<double, std::vector<IsoPoint>> by_budget;
  for (auto& p : points) {
    if (!(p.budget > 0) || !(p.n_c > 0) || !(p.loss > 0))
      fail("isoFLOP point with non-positive budget, n_c or loss (", p.budget, ", ", p.n_c, ", ", p.loss, ")");
    by_budget[p.budget].push_back(p);
  }
  std::vector<IsoMinimum> out;
  for (auto& [budget, pts] : by_budget) {
    std::sort(pts.begin(), pts.end(), [](auto& a, auto& b) { return a.n_c < b.n_c; });
    if (window > 0 && (int)pts.size() > window) {
      // Slide a window of `window` neighbours (in N_c order) centred on the lowest loss.
      size_t best = 0;
      for (size_t i = 1; i < pts.size(); ++i)
        if (pts[i].loss < pts[best].loss) best = i;
      size_t lo = best >= size_t(window / 2) ? best - window / 2 : 0;
      lo = std::min(lo, pts.size() - window);
      pts = std::vector<IsoPoint>(pts.begin() + lo, pts.begin() + lo + window);
    }
    if (pts.size() < 3) fail("isoFLOP profile at budget ", budget, " has ", pts.size(), " point(s); a quadratic fit needs at least 3");
    std::vector<double> x, y;
    for (auto& p : pts) x.push_back(std::log10(p.n_c)), y.push_back(p.loss);
    IsoMinimum m;
    m.budget = budget;
    m.n_points = (int)pts.size();
    m.quad = fit_quadratic(x, y);
    if (!(m.quad.a > 0)) {
      size_t best = 0;
      for (size_t i = 1; i < pts.size(); ++i)
        if (pts[i].loss < pts[best].loss) best = i;
      m.method = "lowest_run";
      m.extrapolated = best == 0 || best + 1 == pts.size();
      m.n_c_opt = pts[best].n_c;
      m.tokens_opt = budget / (6.0 * m.n_c_opt);
      m.loss_opt = pts[best].loss;
      out.push_back(m);
      continue;
    }
    double u = m.quad.argmin();
    m.extrapolated = u < x.front() || u > x.back();
    m.n_c_opt = std::pow(10.0, u);
    m.tokens_opt = budget / (6.0 * m.n_c_opt);
    m.loss_opt = m.quad.at(u);
    out.push_back(m);
  }
  return out;
}

}  // namespace jtok
