// `jtok import --from HF_DIR --out DIR`: a Hugging Face Llama / Qwen2 / Qwen3 / Qwen3-MoE model
// directory as an ordinary jtok checkpoint at step 0 (src/hf/hf_import.h, docs/import.md).
#include <cstdio>

#include "commands.h"
#include "hf/hf_import.h"

namespace cmd_import {

struct Args {
  jtok::ImportOptions opt;
  bool no_tokenizer = false;
} args;

void run() {
  args.opt.require_tokenizer = !args.no_tokenizer;
  int reported = 0;  // tenths of the weights written, printed as they pass
  args.opt.progress = [&](uint64_t done, uint64_t total) {
    const int tenth = total ? static_cast<int>(10 * done / total) : 10;
    if (tenth <= reported || total < (1ull << 28)) return;  // models under 256 MB: no progress lines
    reported = tenth;
    std::fprintf(stderr, "import: %d%% of the weights (%.2f of %.2f GB)\n", 10 * tenth, done / 1e9, total / 1e9);
  };
  const jtok::ImportReport r = jtok::import_hf(args.opt);
  std::printf("import: %s (%s) -> %s: %lld tensors, %lld parameters, %.1f MB f32, tokenizer %s\n", args.opt.from.c_str(),
              r.hf_model_type.c_str(), args.opt.out.c_str(), static_cast<long long>(r.tensors),
              static_cast<long long>(r.params), static_cast<double>(r.bytes) / 1e6,
              r.tokenizer.empty() ? "none (--no-tokenizer)" : ("tokenizer.json (" + r.tokenizer + ")").c_str());
}

void setup(CLI::App* sub) {
  sub->add_option("--from", args.opt.from, "Hugging Face model directory (config.json, model.safetensors or its index, tokenizer.json)")
      ->required();
  sub->add_option("--out", args.opt.out, "new checkpoint directory (written under a temp name, then renamed)")->required();
  sub->add_option("--max-positions", args.opt.max_positions,
                  "max_position_embeddings of the checkpoint (sizes the rope table; default: the model's, at most 32768)")
      ->check(CLI::PositiveNumber);
  sub->add_flag("--no-tokenizer", args.no_tokenizer, "import a directory without tokenizer.json (the weights alone)");
  sub->callback(run);
}

const bool registered = jtok::register_command(
    {"import", "a Hugging Face llama / qwen2 / qwen3 / qwen3_moe model as a jtok checkpoint (step 0)", setup});

}  // namespace cmd_import
