// `jtok plot-curves`: training and validation loss curves of runs (their log.jsonl) as one SVG.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "scaling/svg_plot.h"

namespace {

struct Args {
  std::vector<std::string> runs, labels;
  std::string out, title = "loss curves", metric = "loss";
  double ema = 0.95;
} args;

void run() {
  using namespace jtok;
  Plot p;
  p.title = args.title;
  p.x_label = "tokens";
  p.y_label = args.metric;
  const bool loss_plot = args.metric == "loss";
  for (size_t i = 0; i < args.runs.size(); ++i) {
    const std::string path = (std::filesystem::path(args.runs[i]) / "log.jsonl").string();
    std::ifstream in(path);
    if (!in) fail("cannot read ", path);
    const std::string label = i < args.labels.size() ? args.labels[i] : args.runs[i];
    PlotSeries train{label + (loss_plot ? " train (EMA)" : ""), {}, {}, true, false, false, ""}, val{label + " val", {}, {}, true, true, true, ""};
    double ema = 0, tokens_per_step = 0;
    bool first = true;
    std::string line;
    int64_t lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) fail(path, ":", lineno, ": not JSON");
      const std::string type = j.value("type", "");
      if (type == "step") {
        if (!j.contains(args.metric)) fail(path, ":", lineno, ": step line has no field '", args.metric, "'");
        const double loss = j.at(args.metric).get<double>();
        ema = first ? loss : args.ema * ema + (1 - args.ema) * loss;
        first = false;
        tokens_per_step = j.at("tokens").get<double>() / j.at("step").get<double>();
        train.x.push_back(j.at("tokens").get<double>());
        train.y.push_back(ema);
      } else if (type == "val" && loss_plot) {
        val.x.push_back(j.at("step").get<double>() * tokens_per_step);
        val.y.push_back(j.at("val_loss").get<double>());
      }
    }
    if (train.x.empty()) fail(path, " has no step lines");
    val.color = train.color = std::string(i == 0 ? "#1f77b4" : i == 1 ? "#d62728" : i == 2 ? "#2ca02c" : i == 3 ? "#9467bd" : "#ff7f0e");
    p.series.push_back(train);
    if (!val.x.empty()) p.series.push_back(val);
  }
  write_svg(args.out, p);
  std::printf("wrote %s\n", args.out.c_str());
}

void setup(CLI::App* sub) {
  sub->add_option("--run", args.runs, "run directory with log.jsonl (repeatable)")->required();
  sub->add_option("--label", args.labels, "legend label per run (repeatable, in order)");
  sub->add_option("--out", args.out, "output SVG")->required();
  sub->add_option("--title", args.title, "plot title");
  sub->add_option("--ema", args.ema, "smoothing of the training loss (0 = none)");
  sub->add_option("--metric", args.metric, "the step lines' field to plot (loss, hidden_std, jtokm_aux_loss, ...)");
  sub->callback(run);
}

const bool registered = jtok::register_command({"plot-curves", "loss curves of runs as an SVG", setup});

}  // namespace
