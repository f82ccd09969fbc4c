// `jtok plot-csv`: one column of a CSV against another as an SVG, one series per value of a group
// column (e.g. a study's rows: val_loss against seed per variant). Pictures of the studies are drawn
// from their committed CSVs alone (scripts/study_*.sh).
#include <cstdio>

#include "commands.h"
#include "scaling/csv_plot.h"
#include "scaling/svg_plot.h"
#include "scaling/table.h"

namespace cmd_plot_csv {

struct Args {
  std::string csv, x, y, group, out, title, x_label, y_label;
  std::vector<std::string> where;
  bool log_x = false, no_line = false;
} args;

void run() {
  const jtok::CsvPlotOptions opt{args.x, args.y, args.group, args.title, args.x_label, args.y_label,
                                 args.where, args.log_x, args.no_line};
  const jtok::CsvPlot cp = jtok::csv_plot(jtok::read_csv(args.csv), args.csv, opt);
  jtok::write_svg(args.out, cp.plot);
  std::printf("wrote %s (%zu rows, %zu series)\n", args.out.c_str(), cp.rows_kept, cp.plot.series.size());
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

}  // namespace cmd_plot_csv
