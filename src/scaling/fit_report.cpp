#include "scaling/fit_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "scaling/bootstrap.h"
#include "scaling/frontier.h"
#include "scaling/isoflops.h"
#include "scaling/kaplan.h"
#include "scaling/svg_plot.h"
#include "scaling/table.h"

namespace jtok {

namespace {

// Runs f; an error from the fit is prefixed with the file it came from.
template <typename F>
auto with_file(const std::string& path, F f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind(path, 0) == 0) throw;  // already names the file
    fail(path, ": ", msg);
  }
}

std::string stem(const std::string& path) { return std::filesystem::path(path).stem().string(); }

void require_positive(const CsvTable& t, const std::string& col) {
  auto v = t.numbers(col);
  for (size_t i = 0; i < v.size(); ++i)
    if (!(v[i] > 0)) fail(t.path, ":", t.line_of_row[i], ": column '", col, "': must be positive, got ", t.rows[i][t.index(col)]);
}

struct Curve {
  std::string file, label, source;
  std::vector<double> compute, loss;
};

Plot frontier_plot(const std::vector<Curve>& curves, const FrontierComparison& cmp) {
  Plot p;
  p.title = "Efficient frontiers: log2 L = alpha log10 C + beta";
  p.x_label = "compute C (FLOPs)";
  p.y_label = "loss L*";
  p.log_x = p.log_y = true;
  for (size_t k = 0; k < curves.size(); ++k) {
    const char* color[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
    PlotSeries pts{curves[k].label, curves[k].compute, curves[k].loss, false, true, false, color[k % 6]};
    p.series.push_back(pts);
    const auto& f = cmp.separate[k];
    PlotSeries line;
    char lab[96];
    std::snprintf(lab, sizeof lab, "a=%.4f b=%.4f", f.alpha, f.beta);
    line.label = lab;
    line.markers = false;
    line.dashed = true;
    line.color = color[k % 6];
    double lo = *std::min_element(curves[k].compute.begin(), curves[k].compute.end());
    double hi = *std::max_element(curves[k].compute.begin(), curves[k].compute.end());
    for (int i = 0; i <= 20; ++i) {
      double x = std::log10(lo) + (std::log10(hi) - std::log10(lo)) * i / 20.0;
      line.x.push_back(std::pow(10.0, x));
      line.y.push_back(std::pow(2.0, f.alpha * x + f.beta));
    }
    p.series.push_back(line);
  }
  return p;
}

Plot isoflops_plot(const std::string& file, const std::vector<IsoPoint>& pts, const std::vector<IsoMinimum>& mins) {
  Plot p;
  p.title = "IsoFLOP profiles: " + stem(file);
  p.x_label = "N_c (compute-intensive parameters)";
  p.y_label = "loss";
  p.log_x = true;
  PlotSeries opt{"minima L*(C)", {}, {}, true, true, true, "black"};
  for (auto& m : mins) {
    PlotSeries s;
    s.label = "C=" + fmt_double(m.budget);
    s.line = false;
    for (auto& q : pts)
      if (q.budget == m.budget) s.x.push_back(q.n_c), s.y.push_back(q.loss);
    p.series.push_back(s);
    // The fitted quadratic over the budget's range of N_c, same colour (next series index).
    PlotSeries fit;
    fit.markers = false;
    fit.color = "";
    double lo = *std::min_element(s.x.begin(), s.x.end()), hi = *std::max_element(s.x.begin(), s.x.end());
    for (int i = 0; i <= 30; ++i) {
      double u = std::log10(lo) + (std::log10(hi) - std::log10(lo)) * i / 30.0;
      fit.x.push_back(std::pow(10.0, u)), fit.y.push_back(m.quad.at(u));
    }
    p.series.push_back(fit);
    opt.x.push_back(m.n_c_opt), opt.y.push_back(m.loss_opt);
  }
  // Pair the colours of points and their fit: both series of budget k use palette entry k.
  const char* color[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  for (size_t i = 0; i < p.series.size(); ++i) p.series[i].color = color[(i / 2) % 8];
  p.series.push_back(opt);
  return p;
}

// Kaplan eq. 1 over every run of an isoFLOP file (D = tokens, or C / (6 N_c) without a tokens
// column), into j["kaplan"]; skipped (said in j) with fewer than 6 runs or 2 budgets.
void add_kaplan_fit(nlohmann::json& j, const std::string& f, const std::vector<double>& budget, const std::vector<double>& n_c,
                    const std::vector<double>& loss, const std::vector<double>& tokens) {
  std::set<double> budgets(budget.begin(), budget.end());
  if (budget.size() >= 6 && budgets.size() >= 2) {
    std::vector<double> d(budget.size());
    for (size_t i = 0; i < budget.size(); ++i) d[i] = tokens.empty() ? budget[i] / (6 * n_c[i]) : tokens[i];
    KaplanFit k = with_file(f, [&] { return fit_kaplan(n_c, d, loss); });
    j["kaplan"] = {{"A", k.p.A}, {"B", k.p.B}, {"alpha", k.p.alpha}, {"beta", k.p.beta},
                   {"frontier_exponent", k.p.frontier_exponent()}, {"rmse_log", k.rmse_log}, {"r2_log", k.r2},
                   {"n", k.n}, {"tokens_from", tokens.empty() ? "budget/(6 n_c)" : "tokens"}};
  } else {
    j["kaplan"] = nullptr;
    j["kaplan_skipped"] = "needs at least 6 runs over at least 2 budgets";
  }
}

// One --isoflops file: the minimum of each budget, Kaplan's fit, its picture. pts gets its runs
// (for the bootstrap), curve its minima (a frontier).
nlohmann::json fit_isoflops_file(const std::string& f, const FitInputs& in, std::vector<IsoPoint>& pts, Curve& curve) {
  CsvTable t = read_csv(f);
  const std::string bcol = t.has("budget") ? "budget" : "compute";
  auto budget = t.numbers(bcol), n_c = t.numbers("n_c"), loss = t.numbers("loss");
  require_positive(t, bcol), require_positive(t, "n_c"), require_positive(t, "loss");
  std::vector<double> tokens = t.has("tokens") ? t.numbers("tokens") : std::vector<double>{};
  if (!tokens.empty()) require_positive(t, "tokens");
  for (size_t i = 0; i < budget.size(); ++i) pts.push_back({budget[i], n_c[i], loss[i]});
  auto mins = with_file(f, [&] { return fit_isoflops(pts, in.window); });
  nlohmann::json j = {{"file", f}, {"budget_column", bcol}, {"n", pts.size()}};
  nlohmann::json jm = nlohmann::json::array();
  curve = Curve{f, stem(f), "isoflops", {}, {}};
  for (auto& m : mins) {
    jm.push_back({{"budget", m.budget}, {"n_c_opt", m.n_c_opt}, {"tokens_opt", m.tokens_opt}, {"loss_opt", m.loss_opt},
                  {"n_points", m.n_points}, {"extrapolated", m.extrapolated}, {"method", m.method}, {"curvature", m.quad.a},
                  {"r2", m.quad.r2}});
    curve.compute.push_back(m.budget), curve.loss.push_back(m.loss_opt);
  }
  j["minima"] = jm;
  add_kaplan_fit(j, f, budget, n_c, loss, tokens);
  if (!in.svg_dir.empty()) {
    std::string path = in.svg_dir + "/isoflops_" + stem(f) + ".svg";
    write_svg(path, isoflops_plot(f, pts, mins));
    j["svg"] = path;
  }
  if (mins.size() < 3) j["frontier_skipped"] = "fewer than 3 budgets";
  return j;
}

// The bootstrap of the savings over the isoFLOP files' runs: percentiles per frontier.
nlohmann::json bootstrap_json(const FitInputs& in, const std::vector<Curve>& curves,
                              const std::vector<std::vector<IsoPoint>>& iso_points) {
  BootstrapOptions bo;
  bo.replicates = in.bootstrap, bo.seed = in.bootstrap_seed, bo.method = in.bootstrap_method, bo.window = in.window;
  SavingBootstrap b = bootstrap_saving(iso_points, bo);
  auto pj = [](const Percentiles& p) { return nlohmann::json{{"lo", p.lo}, {"median", p.median}, {"hi", p.hi}}; };
  nlohmann::json per = nlohmann::json::array();
  for (size_t k = 0; k < curves.size(); ++k) {
    nlohmann::json j = {{"file", curves[k].file}, {"alpha", pj(b.alpha_pct[k])}};
    if (k > 0) j["saving_separate"] = pj(b.separate[k]), j["saving_shared_slope"] = pj(b.shared_slope[k]);
    per.push_back(j);
  }
  return {{"method", bo.method}, {"replicates", b.replicates}, {"seed", bo.seed}, {"level", bo.level},
          {"redraws", b.redraws}, {"lowest_run_replicates", b.lowest_run_replicates},
          {"extrapolated_replicates", b.extrapolated_replicates}, {"failed_resamples", b.failed_resamples},
          {"frontiers", per}};
}

// The frontiers compared (the first is the base of the savings), into out: each one's fit and
// savings, the shared-slope fit, the bootstrap, the picture.
void add_frontiers(nlohmann::json& out, const FitInputs& in, const std::vector<Curve>& curves,
                   const std::vector<std::vector<IsoPoint>>& iso_points) {
  std::vector<std::vector<double>> cs, ls;
  for (auto& c : curves) cs.push_back(c.compute), ls.push_back(c.loss);
  FrontierComparison cmp = with_file(curves[0].file, [&] { return compare_frontiers(cs, ls); });
  nlohmann::json fr = nlohmann::json::array();
  for (size_t k = 0; k < curves.size(); ++k) {
    const auto& s = cmp.separate[k];
    nlohmann::json j = {{"file", curves[k].file}, {"label", curves[k].label}, {"source", curves[k].source},
                        {"n", s.n}, {"alpha", s.alpha}, {"beta", s.beta}, {"r2", s.r2}};
    if (k > 0) {
      j["delta_beta_separate"] = cmp.separate[0].beta - s.beta;
      j["delta_beta_shared"] = cmp.shared.intercepts[0] - cmp.shared.intercepts[k];
      j["saving_separate"] = cmp.saving_separate[k];
      j["saving_shared_slope"] = cmp.saving_shared_slope[k];
    }
    fr.push_back(j);
  }
  out["frontiers"] = fr;
  if (curves.size() >= 2) {
    out["saving_separate"] = cmp.saving_separate[1];
    out["saving_shared_slope"] = cmp.saving_shared_slope[1];
    out["shared_slope"] = {{"alpha", cmp.shared.slope}, {"betas", cmp.shared.intercepts}, {"r2", cmp.shared.r2}};
  }
  if (in.bootstrap > 0) out["bootstrap"] = bootstrap_json(in, curves, iso_points);
  if (!in.svg_dir.empty()) {
    std::string path = in.svg_dir + "/frontiers.svg";
    write_svg(path, frontier_plot(curves, cmp));
    out["frontiers_svg"] = path;
  }
}

Plot eta_plot(const std::string& file, const std::vector<double>& eta, const std::vector<double>& loss, const LineFit& f) {
  Plot p;
  p.title = "Loss against eta = N_n / N_c";
  p.x_label = "eta";
  p.y_label = "loss";
  p.log_x = true;
  p.series.push_back({stem(file), eta, loss, false, true, false, ""});
  PlotSeries line;
  char lab[64];
  std::snprintf(lab, sizeof lab, "%.4f per doubling", f.slope);
  line.label = lab, line.markers = false, line.dashed = true;
  double lo = *std::min_element(eta.begin(), eta.end()), hi = *std::max_element(eta.begin(), eta.end());
  line.x = {lo, hi}, line.y = {f.slope * std::log2(lo) + f.intercept, f.slope * std::log2(hi) + f.intercept};
  p.series.push_back(line);
  return p;
}

// The --eta file: loss against log2 eta, a line; its picture.
nlohmann::json fit_eta_file(const FitInputs& in) {
  CsvTable t = read_csv(in.eta_file);
  auto eta = t.numbers("eta"), loss = t.numbers("loss");
  require_positive(t, "eta");
  if (eta.size() < 3) fail(in.eta_file, ": eta fit needs at least 3 points, got ", eta.size());
  LineFit f = with_file(in.eta_file, [&] { return fit_eta(eta, loss); });
  nlohmann::json j = {{"file", in.eta_file}, {"slope_per_doubling", f.slope}, {"intercept", f.intercept}, {"r2", f.r2}, {"n", f.n}};
  if (!in.svg_dir.empty()) {
    std::string path = in.svg_dir + "/eta.svg";
    write_svg(path, eta_plot(in.eta_file, eta, loss, f));
    j["svg"] = path;
  }
  return j;
}

}  // namespace

nlohmann::json run_fits(const FitInputs& in) {
  if (in.frontier_files.empty() && in.isoflops_files.empty() && in.eta_file.empty())
    fail("scaling fit: nothing to fit: give --frontier, --isoflops or --eta files");
  if (!in.svg_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(in.svg_dir, ec);
    if (ec) fail(in.svg_dir, ": cannot create directory: ", ec.message());
  }
  nlohmann::json out = nlohmann::json::object();
  std::vector<Curve> curves;

  for (auto& f : in.frontier_files) {
    CsvTable t = read_csv(f);
    Curve c{f, stem(f), "frontier", t.numbers("compute"), t.numbers("loss")};
    require_positive(t, "compute"), require_positive(t, "loss");
    if (c.compute.size() < 3) fail(f, ": frontier fit needs at least 3 points, got ", c.compute.size());
    curves.push_back(c);
  }

  if (in.bootstrap < 0) fail("scaling fit: --bootstrap must be >= 0, got ", in.bootstrap);
  if (in.bootstrap > 0 && (!in.frontier_files.empty() || in.isoflops_files.size() < 2))
    fail("scaling fit: --bootstrap resamples runs: give at least 2 --isoflops files (the first is the base) and no --frontier");
  std::vector<std::vector<IsoPoint>> iso_points;  // per isoflops file, for the bootstrap
  nlohmann::json isos = nlohmann::json::array();
  for (auto& f : in.isoflops_files) {
    std::vector<IsoPoint> pts;
    Curve c;
    isos.push_back(fit_isoflops_file(f, in, pts, c));
    iso_points.push_back(pts);
    if (!isos.back().contains("frontier_skipped")) curves.push_back(c);
  }
  if (!isos.empty()) out["isoflops"] = isos;
  if (in.bootstrap > 0)
    for (size_t k = 0; k < isos.size(); ++k)
      if (isos[k].contains("frontier_skipped"))
        fail(in.isoflops_files[k], ": --bootstrap needs at least 3 budgets per --isoflops file, got ", isos[k]["minima"].size());
  if (!curves.empty()) add_frontiers(out, in, curves, iso_points);
  if (!in.eta_file.empty()) out["eta"] = fit_eta_file(in);
  return out;
}

namespace {

// The isoFLOP minima (and Kaplan fit) of each file in j["isoflops"].
std::string isoflops_text(const nlohmann::json& j) {
  std::string s;
  char b[512];
  for (auto& iso : j["isoflops"]) {
    s += "isoFLOP profiles of " + iso["file"].get<std::string>() + ":\n";
    for (auto& m : iso["minima"]) {
      std::snprintf(b, sizeof b, "  C %-10.4g N_c* %-10.4g D* %-10.4g L* %.4f  (%d points%s)\n", m["budget"].get<double>(),
                    m["n_c_opt"].get<double>(), m["tokens_opt"].get<double>(), m["loss_opt"].get<double>(),
                    m["n_points"].get<int>(),
                    m.value("method", "quadratic") == "lowest_run"
                        ? (m["extrapolated"].get<bool>() ? ", not U-shaped: lowest run, at an end of the range"
                                                         : ", not U-shaped: lowest run")
                        : (m["extrapolated"].get<bool>() ? ", minimum extrapolated" : ""));
      s += b;
    }
    if (!iso["kaplan"].is_null()) {
      auto& k = iso["kaplan"];
      std::snprintf(b, sizeof b, "  Kaplan: L = [(A/N)^(alpha/beta) + B/D]^beta, A %.4g B %.4g alpha %.4f beta %.4f (rmse of ln L %.3g)\n",
                    k["A"].get<double>(), k["B"].get<double>(), k["alpha"].get<double>(), k["beta"].get<double>(),
                    k["rmse_log"].get<double>());
      s += b;
    }
  }
  return s;
}

// The frontiers of j["frontiers"], their savings and the shared slope.
std::string frontiers_text(const nlohmann::json& j) {
  std::string s;
  char b[512];
  s += "frontiers: log2 L = alpha log10 C + beta\n";
  for (auto& f : j["frontiers"]) {
    std::snprintf(b, sizeof b, "  %-28s alpha %.4f  beta %.4f  R^2 %.4f  (%d points)", f["label"].get<std::string>().c_str(),
                  f["alpha"].get<double>(), f["beta"].get<double>(), f["r2"].get<double>(), f["n"].get<int>());
    s += b;
    if (f.contains("saving_separate")) {
      std::snprintf(b, sizeof b, "  saving: %.1f%% separate (delta beta %.4f), %.1f%% shared slope (delta beta %.4f)",
                    100 * f["saving_separate"].get<double>(), f["delta_beta_separate"].get<double>(),
                    100 * f["saving_shared_slope"].get<double>(), f["delta_beta_shared"].get<double>());
      s += b;
    }
    s += "\n";
  }
  if (j.contains("shared_slope")) {
    std::snprintf(b, sizeof b, "  shared slope alpha %.4f (R^2 %.4f)\n", j["shared_slope"]["alpha"].get<double>(),
                  j["shared_slope"]["r2"].get<double>());
    s += b;
  }
  return s;
}

// The bootstrap intervals of j["bootstrap"].
std::string bootstrap_text(const nlohmann::json& j) {
  std::string s;
  char b[512];
  auto& bs = j["bootstrap"];
  std::snprintf(b, sizeof b,
                "bootstrap over runs (%s, %d replicates, seed %llu; %d with a lowest-run fallback, %d with an extrapolated minimum, "
                "%lld resamples not refittable and drawn again):\n",
                bs["method"].get<std::string>().c_str(), bs["replicates"].get<int>(),
                static_cast<unsigned long long>(bs["seed"].get<uint64_t>()), bs["lowest_run_replicates"].get<int>(),
                bs["extrapolated_replicates"].get<int>(), static_cast<long long>(bs["failed_resamples"].get<int64_t>()));
  s += b;
  const double lvl = 100 * bs["level"].get<double>();
  for (auto& f : bs["frontiers"]) {
    auto& a = f["alpha"];
    std::snprintf(b, sizeof b, "  %-28s alpha %.0f%% [%.4f, %.4f]", stem(f["file"].get<std::string>()).c_str(), lvl,
                  a["lo"].get<double>(), a["hi"].get<double>());
    s += b;
    if (f.contains("saving_separate")) {
      auto& p = f["saving_separate"];
      auto& q = f["saving_shared_slope"];
      std::snprintf(b, sizeof b, "  saving separate [%.1f%%, %.1f%%] (median %.1f%%), shared slope [%.1f%%, %.1f%%] (median %.1f%%)",
                    100 * p["lo"].get<double>(), 100 * p["hi"].get<double>(), 100 * p["median"].get<double>(),
                    100 * q["lo"].get<double>(), 100 * q["hi"].get<double>(), 100 * q["median"].get<double>());
      s += b;
    }
    s += "\n";
  }
  return s;
}

}  // namespace

std::string fit_report_text(const nlohmann::json& j) {
  std::string s;
  char b[512];
  if (j.contains("isoflops")) s += isoflops_text(j);
  if (j.contains("frontiers")) s += frontiers_text(j);
  if (j.contains("bootstrap")) s += bootstrap_text(j);
  if (j.contains("eta")) {
    auto& e = j["eta"];
    std::snprintf(b, sizeof b, "eta: loss = %.5f log2(eta) + %.4f  R^2 %.4f  (%d points)\n", e["slope_per_doubling"].get<double>(),
                  e["intercept"].get<double>(), e["r2"].get<double>(), e["n"].get<int>());
    s += b;
  }
  return s;
}

}  // namespace jtok
