// One column of a CSV table against another as a plot (`jtok plot-csv`), one series per value of a
// group column (e.g. a study's rows: val_loss against seed per variant), after --where filters.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "scaling/svg_plot.h"
#include "scaling/table.h"

namespace jtok {

struct CsvPlotOptions {
  std::string x, y, group;              // columns; no group: one series named after y
  std::string title, x_label, y_label;  // "" = "Y vs X", X, Y
  std::vector<std::string> where;       // column=value or column!=value, all must hold
  bool log_x = false, no_line = false;
};

struct CsvPlot {
  Plot plot;              // series sorted by group value, points by x
  size_t rows_kept = 0;   // rows that passed the filters
};

// csv_name names the table in errors (a missing column, a bad --where, no rows left, x <= 0 with log_x).
CsvPlot csv_plot(const CsvTable& t, const std::string& csv_name, const CsvPlotOptions& opt);

}  // namespace jtok
