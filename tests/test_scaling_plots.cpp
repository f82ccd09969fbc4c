// The plots `jtok plot-csv` and `jtok plot-curves` draw: a CSV's rows filtered, grouped and sorted
// into series (scaling/csv_plot.h), and runs' log.jsonl into smoothed loss curves (scaling/loss_curves.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "error_test_util.h"
#include "scaling/csv_plot.h"
#include "scaling/loss_curves.h"
#include "temp_dir.h"

using namespace jtok;
using jtok::testing::expect_error;

namespace {
const CsvTable kRuns = parse_csv(
    "variant,seed,loss,config\n"
    "b,2,3.5,x\n"
    "a,3,2.5,x\n"
    "a,1,2.0,x\n"
    "b,1,3.0,y\n"
    "a,2,9.0,y\n",
    "runs.csv");
}  // namespace

TEST(CsvPlot, RowsFilteredGroupedAndSortedByX) {
  CsvPlotOptions o;
  o.x = "seed";
  o.y = "loss";
  o.group = "variant";
  o.where = {"config=x"};
  const CsvPlot p = csv_plot(kRuns, "runs.csv", o);
  EXPECT_EQ(p.rows_kept, 3u);
  ASSERT_EQ(p.plot.series.size(), 2u);
  EXPECT_EQ(p.plot.series[0].label, "a");  // groups in value order
  EXPECT_EQ(p.plot.series[0].x, (std::vector<double>{1, 3}));
  EXPECT_EQ(p.plot.series[0].y, (std::vector<double>{2.0, 2.5}));
  EXPECT_EQ(p.plot.series[1].x, (std::vector<double>{2}));
  EXPECT_EQ(p.plot.title, "loss vs seed");
  o.where = {"config!=x"};
  o.group.clear();
  const CsvPlot q = csv_plot(kRuns, "runs.csv", o);
  ASSERT_EQ(q.plot.series.size(), 1u);  // no group: one series named after y
  EXPECT_EQ(q.plot.series[0].label, "loss");
  EXPECT_EQ(q.plot.series[0].y, (std::vector<double>{3.0, 9.0}));
}

TEST(CsvPlot, BadInputNamesWhatIsWrong) {
  CsvPlotOptions o;
  o.x = "seed";
  o.y = "nosuch";
  expect_error([&] { csv_plot(kRuns, "runs.csv", o); }, {"missing column 'nosuch'"});
  o.y = "loss";
  o.where = {"config"};
  expect_error([&] { csv_plot(kRuns, "runs.csv", o); }, {"--where 'config'", "column=value"});
  o.where = {"config=z"};
  expect_error([&] { csv_plot(kRuns, "runs.csv", o); }, {"runs.csv", "no rows left"});
  o.where.clear();
  o.x = "loss";
  o.log_x = true;
  const CsvTable neg = parse_csv("loss,seed\n-1,2\n", "neg.csv");
  expect_error([&] { csv_plot(neg, "neg.csv", o); }, {"neg.csv", "not positive", "--log-x"});
}

TEST(LossCurves, EmaOfStepsAndValidationAtTheirTokens) {
  const std::string run = jtok::testing::fresh_temp_dir("loss_curves");
  std::filesystem::create_directories(run);
  std::ofstream(run + "/log.jsonl") << R"({"type":"step","step":1,"tokens":100,"loss":4.0})" "\n"
                                   << R"({"type":"step","step":2,"tokens":200,"loss":2.0})" "\n"
                                   << R"({"type":"val","step":2,"val_loss":3.0})" "\n";
  LossCurveOptions o;
  o.ema = 0.5;
  const Plot p = loss_curves_plot({run}, {"r"}, o);
  ASSERT_EQ(p.series.size(), 2u);
  EXPECT_EQ(p.series[0].label, "r train (EMA)");
  EXPECT_EQ(p.series[0].x, (std::vector<double>{100, 200}));
  EXPECT_EQ(p.series[0].y, (std::vector<double>{4.0, 3.0}));  // 0.5 * 4 + 0.5 * 2
  EXPECT_EQ(p.series[1].x, (std::vector<double>{200}));        // step 2 x 100 tokens a step
  EXPECT_EQ(p.series[1].y, (std::vector<double>{3.0}));
  o.metric = "lr";
  expect_error([&] { loss_curves_plot({run}, {}, o); }, {"log.jsonl:1", "no field 'lr'"});
  expect_error([&] { loss_curves_plot({run + "/none"}, {}, o); }, {"cannot read"});
}
