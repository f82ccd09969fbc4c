// `jtok flops`: parameter counts (N_c, N_n, eta, rho, total), training FLOPs per token, and the
// memory a training run holds (state, and one micro-batch's activations by component).
#include <cstdio>
#include "commands.h"
#include "scaling/flops_summary.h"
#include "train/config.h"

namespace cmd_flops {
void setup(CLI::App* sub) {
  static std::string path;
  static std::vector<std::string> sets;
  static bool json = false;
  static int64_t seq_len = 0, micro_batch = 0;
  sub->add_option("--config", path, "config JSON file")->required();
  sub->add_option("--set", sets, "override a field: name=value (repeatable)");
  sub->add_option("--seq-len", seq_len, "sequence length for the attention FLOPs (default: the config's seq_len)");
  sub->add_option("--micro-batch", micro_batch, "sequences per micro-batch for the activation memory (default: the config's micro_batch_size)");
  sub->add_flag("--json", json, "print one JSON object");
  sub->callback([] {
    const jtok::Config cfg = jtok::load_config(path, sets);
    const jtok::FlopsSummary s = jtok::flops_summary(cfg, seq_len, micro_batch);
    if (json) {
      std::printf("%s\n", jtok::to_json(s).dump(2).c_str());
      return;
    }
    const std::string text = jtok::flops_summary_text(s, cfg);
    std::fwrite(text.data(), 1, text.size(), stdout);
  });
}
const bool registered = jtok::register_command({"flops", "parameter counts (N_c, N_n, eta, rho) and FLOPs per token", setup});
}  // namespace cmd_flops
