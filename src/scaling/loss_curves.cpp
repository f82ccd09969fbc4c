#include "scaling/loss_curves.h"

#include <cstdint>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace jtok {

namespace {

// Run i's colour: the first four of a fixed palette, then orange.
std::string run_color(size_t i) {
  return std::string(i == 0 ? "#1f77b4" : i == 1 ? "#d62728" : i == 2 ? "#2ca02c" : i == 3 ? "#9467bd" : "#ff7f0e");
}

// Reads path's step and val lines into train (EMA of the metric against tokens) and val (val_loss
// against step * tokens per step, for the loss only).
void read_run_log(const std::string& path, const LossCurveOptions& opt, PlotSeries& train, PlotSeries& val) {
  std::ifstream in(path);
  if (!in) fail("cannot read ", path);
  const bool loss_plot = opt.metric == "loss";
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
      if (!j.contains(opt.metric)) fail(path, ":", lineno, ": step line has no field '", opt.metric, "'");
      const double loss = j.at(opt.metric).get<double>();
      ema = first ? loss : opt.ema * ema + (1 - opt.ema) * loss;
      first = false;
      tokens_per_step = j.at("tokens").get<double>() / j.at("step").get<double>();
      train.x.push_back(j.at("tokens").get<double>());
      train.y.push_back(ema);
    } else if (type == "val" && loss_plot) {
      val.x.push_back(j.at("step").get<double>() * tokens_per_step);
      val.y.push_back(j.at("val_loss").get<double>());
    }
  }
}

}  // namespace

Plot loss_curves_plot(const std::vector<std::string>& run_dirs, const std::vector<std::string>& labels,
                      const LossCurveOptions& opt) {
  Plot p;
  p.title = opt.title;
  p.x_label = "tokens";
  p.y_label = opt.metric;
  const bool loss_plot = opt.metric == "loss";
  for (size_t i = 0; i < run_dirs.size(); ++i) {
    const std::string path = (std::filesystem::path(run_dirs[i]) / "log.jsonl").string();
    const std::string label = i < labels.size() ? labels[i] : run_dirs[i];
    PlotSeries train{label + (loss_plot ? " train (EMA)" : ""), {}, {}, true, false, false, ""},
        val{label + " val", {}, {}, true, true, true, ""};
    read_run_log(path, opt, train, val);
    if (train.x.empty()) fail(path, " has no step lines");
    val.color = train.color = run_color(i);
    p.series.push_back(train);
    if (!val.x.empty()) p.series.push_back(val);
  }
  return p;
}

}  // namespace jtok
