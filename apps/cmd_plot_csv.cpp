// `jtok plot-csv`: one column of a CSV against another as an SVG, one series per value of a group
// column (e.g. a study's rows: val_loss against seed per variant). Pictures of the studies are drawn
// from their committed CSVs alone (scripts/study_*.sh).
#include <algorithm>
#include <cstdio>
#include <map>

#include "commands.h"
#include "core/error.h"
#include "scaling/svg_plot.h"
#include "scaling/table.h"

namespace {

struct Args {
  std::string csv, x, y, group, out, title, x_label, y_label;
  std::vector<std::string> where;
  bool log_x = false, no_line = false;
} args;

void run() {
  using namespace jtok;
  const CsvTable t = read_csv(args.csv);
  const size_t xi = t.index(args.x), yi = t.index(args.y);
  (void)xi, (void)yi;
  struct Filter { size_t col; std::string value; bool equal; };
  std::vector<Filter> filters;
  for (const auto& w : args.where) {
    const auto eq = w.find('=');
    if (eq == std::string::npos || eq == 0) fail("--where '", w, "': expected column=value or column!=value");
    const bool ne = w[eq - 1] == '!';
    filters.push_back({t.index(w.substr(0, ne ? eq - 1 : eq)), w.substr(eq + 1), !ne});
  }
  std::map<std::string, std::vector<std::pair<double, double>>> groups;  // sorted by group value
  size_t kept = 0;
  for (size_t r = 0; r < t.rows.size(); ++r) {
    bool keep = true;
    for (const auto& f : filters) keep = keep && (t.rows[r][f.col] == f.value) == f.equal;
    if (!keep) continue;
    const std::string g = args.group.empty() ? args.y : t.cell(r, args.group);
    groups[g].emplace_back(t.number(r, args.x), t.number(r, args.y));
    ++kept;
  }
  if (kept == 0) fail(args.csv, ": no rows left after --where");
  Plot p;
  p.title = args.title.empty() ? args.y + " vs " + args.x : args.title;
  p.x_label = args.x_label.empty() ? args.x : args.x_label;
  p.y_label = args.y_label.empty() ? args.y : args.y_label;
  p.log_x = args.log_x;
  for (auto& [g, pts] : groups) {
    std::sort(pts.begin(), pts.end());
    PlotSeries s{g, {}, {}, !args.no_line, true, false, ""};
    for (const auto& [x, y] : pts) {
      if (args.log_x && x <= 0) fail(args.csv, ": column '", args.x, "' has ", x, " (not positive) with --log-x");
      s.x.push_back(x);
      s.y.push_back(y);
    }
    p.series.push_back(std::move(s));
  }
  write_svg(args.out, p);
  std::printf("wrote %s (%zu rows, %zu series)\n", args.out.c_str(), kept, groups.size());
}

void setup(CLI::App* sub) {
  sub->add_option("--csv", args.csv, "CSV file with a header row")->required();
  sub->add_option("--x", args.x, "column on the x axis (numbers)")->required();
  sub->add_option("--y", args.y, "column on the y axis (numbers)")->required();
  sub->add_option("--group", args.group, "column whose values make one series each (default: one series)");
  sub->add_option("--where", args.where, "keep rows with column=value, or column!=value (repeatable; all must hold)");
  sub->add_option("--out", args.out, "output SVG")->required();
  sub->add_option("--title", args.title, "plot title");
  sub->add_option("--x-label", args.x_label, "x axis label (default: the column)");
  sub->add_option("--y-label", args.y_label, "y axis label (default: the column)");
  sub->add_flag("--log-x", args.log_x, "base-10 x axis");
  sub->add_flag("--no-line", args.no_line, "points only");
  sub->callback(run);
}

const bool registered = jtok::register_command({"plot-csv", "one CSV column against another as an SVG, a series per group", setup});

}  // namespace
