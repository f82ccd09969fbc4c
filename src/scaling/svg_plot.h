// A minimal SVG line/scatter plot writer for scaling-law pictures (no dependencies).
#pragma once
#include <string>
#include <vector>

namespace jtok {

struct PlotSeries {
  std::string label;          // legend text ("" = no legend entry)
  std::vector<double> x, y;   // data coordinates (positive where the axis is logarithmic)
  bool line = true;           // join points with a polyline
  bool markers = true;        // draw a circle at each point
  bool dashed = false;
  std::string color;          // "" = next colour of the palette
};

struct Plot {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;  // base-10 axes
  std::vector<PlotSeries> series;
  int width = 720, height = 480;
};

std::string render_svg(const Plot& p);
// Writes the SVG file (temp + rename); fails naming the path when it cannot.
void write_svg(const std::string& path, const Plot& p);

}  // namespace jtok
