// `jtok plot-curves`: training and validation loss curves of runs (their log.jsonl) as one SVG.
#include <cstdio>

#include "commands.h"
#include "scaling/loss_curves.h"
#include "scaling/svg_plot.h"

namespace cmd_plot {

struct Args {
  std::vector<std::string> runs, labels;
  std::string out, title = "loss curves", metric = "loss";
  double ema = 0.95;
} args;

void run() {
  const jtok::Plot p = jtok::loss_curves_plot(args.runs, args.labels, {args.title, args.metric, args.ema});
  jtok::write_svg(args.out, p);
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

}  // namespace cmd_plot
