#include "scaling/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "core/atomic_file.h"

namespace jtok {

namespace {

const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

std::string tick_label(double v, bool log) {
  char b[32];
  if (log) {
    double e = std::log10(v);
    if (std::fabs(e - std::round(e)) < 1e-9) std::snprintf(b, sizeof b, "1e%d", int(std::round(e)));
    else std::snprintf(b, sizeof b, "%.3g", v);
  } else {
    std::snprintf(b, sizeof b, "%.4g", v);
  }
  return b;
}

// One axis: maps data to pixels and chooses ticks.
struct Axis {
  bool log = false;
  double lo = 0, hi = 1;  // in transformed units (log10 when log)
  double t(double v) const { return log ? std::log10(v) : v; }
  // "Nice" steps (1, 2, 2.5, 5 x 10^k) covering [lo, hi] of data units.
  static std::vector<double> linear_ticks(double lo, double hi) {
    std::vector<double> out;
    double span = hi - lo, raw = span / 6, mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = 10 * mag;
    for (double m : {1.0, 2.0, 2.5, 5.0})
      if (m * mag >= raw) { step = m * mag; break; }
    for (double v = std::ceil(lo / step) * step; v <= hi + 1e-9 * span; v += step) out.push_back(std::fabs(v) < 1e-12 * span ? 0 : v);
    return out;
  }
  std::vector<double> ticks() const {  // in data units
    if (!log) return linear_ticks(lo, hi);
    std::vector<double> out;
    for (double e = std::ceil(lo - 1e-9); e <= hi + 1e-9; e += 1) out.push_back(std::pow(10.0, e));
    if (out.size() < 3)  // less than two decades: add 2x and 5x ticks
      for (double e = std::floor(lo); e <= hi; e += 1)
        for (double m : {2.0, 5.0}) {
          double v = m * std::pow(10.0, e);
          if (std::log10(v) >= lo && std::log10(v) <= hi) out.push_back(v);
        }
    // A narrow range (under a factor of ~5): plain steps between the ends.
    if (out.size() < 3) out = linear_ticks(std::pow(10.0, lo), std::pow(10.0, hi));
    std::sort(out.begin(), out.end());
    return out;
  }
};

Axis make_axis(const Plot& p, bool is_x) {
  Axis a;
  a.log = is_x ? p.log_x : p.log_y;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (auto& s : p.series)
    for (double v : is_x ? s.x : s.y) {
      if (a.log && !(v > 0)) fail("plot '", p.title, "': non-positive value ", v, " on a log axis");
      lo = std::min(lo, a.t(v)), hi = std::max(hi, a.t(v));
    }
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (hi - lo < 1e-12) lo -= 0.5, hi += 0.5;
  double pad = 0.05 * (hi - lo);
  a.lo = lo - pad, a.hi = hi + pad;
  return a;
}

}  // namespace

std::string render_svg(const Plot& p) {
  const double L = 80, R = 180, T = 40, B = 60;  // margins; the legend sits in the right one
  const double W = p.width - L - R, H = p.height - T - B;
  Axis ax = make_axis(p, true), ay = make_axis(p, false);
  auto px = [&](double v) { return L + (ax.t(v) - ax.lo) / (ax.hi - ax.lo) * W; };
  auto py = [&](double v) { return T + H - (ay.t(v) - ay.lo) / (ay.hi - ay.lo) * H; };

  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(p.width) + "\" height=\"" +
                  std::to_string(p.height) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + num(L + W / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" + esc(p.title) + "</text>\n";
  // Grid and ticks.
  for (double v : ax.ticks()) {
    double x = px(v);
    s += "<line x1=\"" + num(x) + "\" y1=\"" + num(T) + "\" x2=\"" + num(x) + "\" y2=\"" + num(T + H) + "\" stroke=\"#e0e0e0\"/>\n";
    s += "<text x=\"" + num(x) + "\" y=\"" + num(T + H + 16) + "\" text-anchor=\"middle\">" + tick_label(v, ax.log) + "</text>\n";
  }
  for (double v : ay.ticks()) {
    double y = py(v);
    s += "<line x1=\"" + num(L) + "\" y1=\"" + num(y) + "\" x2=\"" + num(L + W) + "\" y2=\"" + num(y) + "\" stroke=\"#e0e0e0\"/>\n";
    s += "<text x=\"" + num(L - 6) + "\" y=\"" + num(y + 4) + "\" text-anchor=\"end\">" + tick_label(v, ay.log) + "</text>\n";
  }
  s += "<rect x=\"" + num(L) + "\" y=\"" + num(T) + "\" width=\"" + num(W) + "\" height=\"" + num(H) + "\" fill=\"none\" stroke=\"black\"/>\n";
  s += "<text x=\"" + num(L + W / 2) + "\" y=\"" + num(p.height - 15) + "\" text-anchor=\"middle\">" + esc(p.x_label) + "</text>\n";
  s += "<text transform=\"translate(18," + num(T + H / 2) + ") rotate(-90)\" text-anchor=\"middle\">" + esc(p.y_label) + "</text>\n";
  // Series and legend.
  int legend_row = 0;
  for (size_t k = 0; k < p.series.size(); ++k) {
    const auto& se = p.series[k];
    JTOK_CHECK(se.x.size() == se.y.size());
    std::string c = se.color.empty() ? kPalette[k % 8] : se.color;
    std::string dash = se.dashed ? " stroke-dasharray=\"6,4\"" : "";
    if (se.line && se.x.size() > 1) {
      s += "<polyline fill=\"none\" stroke=\"" + c + "\" stroke-width=\"1.8\"" + dash + " points=\"";
      for (size_t i = 0; i < se.x.size(); ++i) s += num(px(se.x[i])) + "," + num(py(se.y[i])) + " ";
      s += "\"/>\n";
    }
    if (se.markers)
      for (size_t i = 0; i < se.x.size(); ++i)
        s += "<circle cx=\"" + num(px(se.x[i])) + "\" cy=\"" + num(py(se.y[i])) + "\" r=\"3.5\" fill=\"" + c + "\"/>\n";
    if (!se.label.empty()) {
      double y = T + 10 + 18 * legend_row++;
      if (se.line)
        s += "<line x1=\"" + num(L + W + 12) + "\" y1=\"" + num(y) + "\" x2=\"" + num(L + W + 36) + "\" y2=\"" + num(y) +
             "\" stroke=\"" + c + "\" stroke-width=\"2\"" + dash + "/>\n";
      if (se.markers) s += "<circle cx=\"" + num(L + W + 24) + "\" cy=\"" + num(y) + "\" r=\"3.5\" fill=\"" + c + "\"/>\n";
      s += "<text x=\"" + num(L + W + 42) + "\" y=\"" + num(y + 4) + "\">" + esc(se.label) + "</text>\n";
    }
  }
  s += "</svg>\n";
  return s;
}

void write_svg(const std::string& path, const Plot& p) { write_file_atomic(path, render_svg(p)); }

}  // namespace jtok
