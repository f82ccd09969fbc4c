// The SVG writer: well-formed output, one marker per point, ticks on narrow log axes.
#include <gtest/gtest.h>

#include "core/error.h"
#include "scaling/svg_plot.h"

using namespace jtok;

namespace {
int count(const std::string& s, const std::string& sub) {
  int n = 0;
  for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + 1)) ++n;
  return n;
}
}  // namespace

TEST(Svg, MarkersLinesLegendAndTicks) {
  Plot p;
  p.title = "a < b & c";
  p.log_x = p.log_y = true;
  p.series.push_back({"points", {3e18, 1e19, 3e19}, {2.65, 2.45, 2.30}, false, true, false, ""});
  p.series.push_back({"fit", {3e18, 3e19}, {2.66, 2.29}, true, false, true, ""});
  std::string s = render_svg(p);
  EXPECT_EQ(s.rfind("<svg", 0), 0u);
  EXPECT_NE(s.find("</svg>"), std::string::npos);
  EXPECT_NE(s.find("a &lt; b &amp; c"), std::string::npos);  // escaped title
  EXPECT_EQ(count(s, "<circle"), 3 + 1);                       // 3 points + the legend marker
  EXPECT_EQ(count(s, "<polyline"), 1);
  EXPECT_NE(s.find("stroke-dasharray"), std::string::npos);
  // The y range 2.29..2.66 is far under a decade: plain ticks such as 2.4 must appear.
  EXPECT_NE(s.find(">2.4<"), std::string::npos);
  EXPECT_NE(s.find(">1e19<"), std::string::npos);
}

TEST(Svg, NonPositiveOnLogAxisFails) {
  Plot p;
  p.log_y = true;
  p.series.push_back({"bad", {1, 2}, {1, -1}, true, true, false, ""});
  EXPECT_THROW(render_svg(p), Error);
}
