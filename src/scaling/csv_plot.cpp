#include "scaling/csv_plot.h"

#include <algorithm>
#include <map>
#include <utility>

#include "core/error.h"

namespace jtok {

namespace {

struct RowFilter {
  size_t col;
  std::string value;
  bool equal;  // == (else !=)
};

std::vector<RowFilter> parse_filters(const CsvTable& t, const std::vector<std::string>& where) {
  std::vector<RowFilter> filters;
  for (const auto& w : where) {
    const auto eq = w.find('=');
    if (eq == std::string::npos || eq == 0) fail("--where '", w, "': expected column=value or column!=value");
    const bool ne = w[eq - 1] == '!';
    filters.push_back({t.index(w.substr(0, ne ? eq - 1 : eq)), w.substr(eq + 1), !ne});
  }
  return filters;
}

using Groups = std::map<std::string, std::vector<std::pair<double, double>>>;  // sorted by group value

// The (x, y) points of the rows that pass every filter, by group value; rows_kept counts them.
Groups group_points(const CsvTable& t, const std::vector<RowFilter>& filters, const CsvPlotOptions& opt,
                    size_t& rows_kept) {
  Groups groups;
  for (size_t r = 0; r < t.rows.size(); ++r) {
    bool keep = true;
    for (const auto& f : filters) keep = keep && (t.rows[r][f.col] == f.value) == f.equal;
    if (!keep) continue;
    const std::string g = opt.group.empty() ? opt.y : t.cell(r, opt.group);
    groups[g].emplace_back(t.number(r, opt.x), t.number(r, opt.y));
    ++rows_kept;
  }
  return groups;
}

}  // namespace

CsvPlot csv_plot(const CsvTable& t, const std::string& csv_name, const CsvPlotOptions& opt) {
  const size_t xi = t.index(opt.x), yi = t.index(opt.y);  // fail on a missing column before anything else
  (void)xi, (void)yi;
  CsvPlot out;
  Groups groups = group_points(t, parse_filters(t, opt.where), opt, out.rows_kept);
  if (out.rows_kept == 0) fail(csv_name, ": no rows left after --where");
  Plot& p = out.plot;
  p.title = opt.title.empty() ? opt.y + " vs " + opt.x : opt.title;
  p.x_label = opt.x_label.empty() ? opt.x : opt.x_label;
  p.y_label = opt.y_label.empty() ? opt.y : opt.y_label;
  p.log_x = opt.log_x;
  for (auto& [g, pts] : groups) {
    std::sort(pts.begin(), pts.end());
    PlotSeries s{g, {}, {}, !opt.no_line, true, false, ""};
    for (const auto& [x, y] : pts) {
      if (opt.log_x && x <= 0) fail(csv_name, ": column '", opt.x, "' has ", x, " (not positive) with --log-x");
      s.x.push_back(x);
      s.y.push_back(y);
    }
    p.series.push_back(std::move(s));
  }
  return out;
}

}  // namespace jtok
