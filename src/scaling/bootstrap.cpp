#include "scaling/bootstrap.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "scaling/frontier.h"
#include "scaling/lstsq.h"

namespace jtok {

double quantile(std::vector<double> v, double q) {
  if (v.empty()) fail("quantile of an empty sample");
  if (!(q >= 0 && q <= 1)) fail("quantile: q must be in [0, 1], got ", q);
  std::sort(v.begin(), v.end());
  double pos = q * double(v.size() - 1);
  size_t i = size_t(std::floor(pos));
  if (i + 1 >= v.size()) return v.back();
  double f = pos - double(i);
  return v[i] + f * (v[i + 1] - v[i]);
}

namespace {

using Profiles = std::map<double, std::vector<IsoPoint>>;  // budget -> runs

size_t distinct_n_c(const std::vector<IsoPoint>& pts) {
  std::set<double> s;
  for (auto& p : pts) s.insert(p.n_c);
  return s.size();
}

struct Fitted {
  FrontierComparison cmp;
  bool lowest_run = false, extrapolated = false;
};

Fitted fit_all(const std::vector<std::vector<IsoPoint>>& variants, int window) {
  Fitted f;
  std::vector<std::vector<double>> cs, ls;
  for (auto& v : variants) {
    auto mins = fit_isoflops(v, window);
    std::vector<double> c, l;
    for (auto& m : mins) {
      c.push_back(m.budget), l.push_back(m.loss_opt);
      f.lowest_run |= m.method == "lowest_run";
      f.extrapolated |= m.extrapolated;
    }
    cs.push_back(c), ls.push_back(l);
  }
  f.cmp = compare_frontiers(cs, ls);
  return f;
}

// The options and every variant's profiles checked once (the point estimate's checks, >= 3
// budgets per variant, >= 3 distinct N_c per profile); the runs grouped by budget into profiles and,
// for "residuals", each profile's quadratic in quads.
void check_and_group(const std::vector<std::vector<IsoPoint>>& variants, const BootstrapOptions& opt,
                     std::vector<Profiles>& profiles, std::vector<std::map<double, QuadFit>>& quads) {
  if (variants.size() < 2) fail("bootstrap: needs a base and at least one other variant, got ", variants.size());
  if (opt.replicates < 1) fail("bootstrap: replicates must be >= 1, got ", opt.replicates);
  if (opt.method != "cases" && opt.method != "residuals")
    fail("bootstrap: method must be 'cases' or 'residuals', got '", opt.method, "'");
  if (!(opt.level > 0 && opt.level < 1)) fail("bootstrap: level must be in (0, 1), got ", opt.level);
  profiles.assign(variants.size(), {});
  quads.assign(variants.size(), {});
  for (size_t k = 0; k < variants.size(); ++k) {
    fit_isoflops(variants[k], opt.window);  // fails on bad points or a profile of < 3 runs
    for (auto& p : variants[k]) profiles[k][p.budget].push_back(p);
    if (profiles[k].size() < 3) fail("bootstrap: variant ", k + 1, " has ", profiles[k].size(), " budget(s); a frontier needs at least 3");
    for (auto& [b, pts] : profiles[k]) {
      if (distinct_n_c(pts) < 3)
        fail("bootstrap: variant ", k + 1, " budget ", b, ": ", distinct_n_c(pts), " distinct N_c; a quadratic needs at least 3");
      if (opt.method == "residuals") {
        if (pts.size() < 4) fail("bootstrap: residuals: variant ", k + 1, " budget ", b, " has ", pts.size(), " runs; needs at least 4");
        std::vector<double> x, y;
        for (auto& p : pts) x.push_back(std::log10(p.n_c)), y.push_back(p.loss);
        quads[k][b] = fit_quadratic(x, y);
      }
    }
  }
}

// "cases": n runs drawn with replacement from pts, drawn again until they hold 3 distinct N_c.
void draw_cases(std::vector<IsoPoint>& into, const std::vector<IsoPoint>& pts, std::mt19937_64& rng,
                SavingBootstrap& out, int64_t max_redraws) {
  const size_t n = pts.size();
  std::vector<IsoPoint> draw(n);
  for (;;) {
    for (size_t i = 0; i < n; ++i) draw[i] = pts[rng() % n];
    if (distinct_n_c(draw) >= 3) break;
    if (++out.redraws > max_redraws) fail("bootstrap: over ", max_redraws, " redraws (profiles too small for the cases method)");
  }
  into.insert(into.end(), draw.begin(), draw.end());
}

// "residuals": pts' runs at the quadratic q plus residuals (rescaled for the 3 fitted
// coefficients) drawn with replacement.
void draw_residuals(std::vector<IsoPoint>& into, const std::vector<IsoPoint>& pts, const QuadFit& q,
                    std::mt19937_64& rng) {
  const size_t n = pts.size();
  const double scale = std::sqrt(double(n) / double(n - 3));
  std::vector<double> res(n);
  for (size_t i = 0; i < n; ++i) res[i] = (pts[i].loss - q.at(std::log10(pts[i].n_c))) * scale;
  for (size_t i = 0; i < n; ++i) {
    IsoPoint p = pts[i];
    p.loss = q.at(std::log10(p.n_c)) + res[rng() % n];
    if (!(p.loss > 0)) fail("bootstrap: residuals: a resampled loss is not positive (", p.loss, ")");
    into.push_back(p);
  }
}

// The percentiles of every variant's replicates at opt.level.
void add_percentiles(SavingBootstrap& out, const BootstrapOptions& opt) {
  const double lo = (1 - opt.level) / 2, hi = (1 + opt.level) / 2;
  auto pct = [&](const std::vector<double>& v) { return Percentiles{quantile(v, lo), quantile(v, 0.5), quantile(v, hi)}; };
  for (size_t k = 0; k < out.saving_separate.size(); ++k) {
    out.separate.push_back(pct(out.saving_separate[k]));
    out.shared_slope.push_back(pct(out.saving_shared_slope[k]));
    out.alpha_pct.push_back(pct(out.alpha[k]));
  }
}

}  // namespace

SavingBootstrap bootstrap_saving(const std::vector<std::vector<IsoPoint>>& variants, const BootstrapOptions& opt) {
  std::vector<Profiles> profiles;
  std::vector<std::map<double, QuadFit>> quads;
  check_and_group(variants, opt, profiles, quads);
  SavingBootstrap out;
  const size_t K = variants.size();
  out.saving_separate.assign(K, {}), out.saving_shared_slope.assign(K, {}), out.alpha.assign(K, {});
  std::mt19937_64 rng(opt.seed);
  const int64_t max_redraws = int64_t(opt.replicates) * 1000;
  for (int r = 0; r < opt.replicates; ++r) {
    if (out.failed_resamples > int64_t(opt.replicates) * 10)
      fail("bootstrap: ", out.failed_resamples, " resamples could not be refitted (", r, " good ones); the profiles are too noisy or too short");
    std::vector<std::vector<IsoPoint>> sample(K);
    for (size_t k = 0; k < K; ++k)
      for (auto& [b, pts] : profiles[k]) {
        if (opt.method == "cases") draw_cases(sample[k], pts, rng, out, max_redraws);
        else draw_residuals(sample[k], pts, quads[k].at(b), rng);
      }
    Fitted f;
    try {
      f = fit_all(sample, opt.window);
    } catch (const Error&) {
      ++out.failed_resamples;
      --r;  // draw this replicate again
      continue;
    }
    out.lowest_run_replicates += f.lowest_run;
    out.extrapolated_replicates += f.extrapolated;
    for (size_t k = 0; k < K; ++k) {
      out.saving_separate[k].push_back(f.cmp.saving_separate[k]);
      out.saving_shared_slope[k].push_back(f.cmp.saving_shared_slope[k]);
      out.alpha[k].push_back(f.cmp.separate[k].alpha);
    }
  }
  out.replicates = opt.replicates;
  add_percentiles(out, opt);
  return out;
}

}  // namespace jtok
