// Loss curves of training runs from their log.jsonl (`jtok plot-curves`): per run, the step
// lines' metric against tokens (smoothed by an EMA when the metric is the loss) and, for the loss,
// the validation lines' val_loss, as series of one plot.
#pragma once
#include <string>
#include <vector>

#include "scaling/svg_plot.h"

namespace jtok {

struct LossCurveOptions {
  std::string title = "loss curves";
  std::string metric = "loss";  // a field of the step lines; "loss" also draws the val lines
  double ema = 0.95;            // the loss's smoothing: ema = ema * previous + (1 - ema) * value
};

// run_dirs[i]'s log.jsonl as a train series (and a val series when it has val lines), labelled
// labels[i] (the directory where labels has fewer entries). Fails naming the file and line of a bad
// line, or a run without step lines.
Plot loss_curves_plot(const std::vector<std::string>& run_dirs, const std::vector<std::string>& labels,
                      const LossCurveOptions& opt);

}  // namespace jtok
