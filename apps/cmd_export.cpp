// `jtok export`: a checkpoint as a file for other engines. Today: GGUF for llama.cpp's `llama`
// architecture (docs/formats.md "GGUF export"); models with token-indexed tables are refused.
#include <cstdio>

#include "commands.h"
#include "core/error.h"
#include "export/gguf_export.h"
#include "run_setup.h"
#include "train/checkpoint.h"

namespace {

struct Args {
  std::string checkpoint, format = "gguf", out, dtype = "f32", name;
} args;

void run() {
  using namespace jtok;
  const std::string dir = resolve_checkpoint(args.checkpoint);
  // Refuse before reading any weights.
  const Config cfg = load_checkpoint_config(dir);
  if (std::string why = gguf_unsupported_reason(cfg.model); !why.empty())
    fail("export: ", dir, " cannot be exported as GGUF: ", why);
  LoadedCheckpoint ck = load_for_inference(dir);
  GgufExportOptions opt;
  opt.dtype = args.dtype == "f16" ? GgmlType::F16 : GgmlType::F32;
  opt.tokenizer = ck.cfg.train.tokenizer;
  opt.name = args.name;
  GgufWriter w;
  build_gguf(ck.model, opt, w);
  w.write(args.out);
  std::printf("export: %s -> %s (gguf v%u, llama, %s, %llu bytes)\n", ck.dir.c_str(), args.out.c_str(), kGgufVersion,
              args.dtype.c_str(), static_cast<unsigned long long>(w.file_size()));
}

void setup(CLI::App* sub) {
  sub->add_option("--checkpoint", args.checkpoint, "checkpoint directory, or a run directory (its newest)")->required();
  sub->add_option("--format", args.format, "output format")->check(CLI::IsMember({"gguf"}));
  sub->add_option("--out", args.out, "output file (written to a temp name, fsynced, renamed)")->required();
  sub->add_option("--dtype", args.dtype, "type of the 2-D weights (norms stay f32)")->check(CLI::IsMember({"f32", "f16"}));
  sub->add_option("--name", args.name, "general.name in the file (default: jtok)");
  sub->callback(run);
}

const bool registered = jtok::register_command(
    {"export", "export a checkpoint for another engine (GGUF for llama.cpp; dense models only)", setup});

}  // namespace
