// `jtok export`: an inference copy of a checkpoint, optionally with JTok's gate folded into its
// tables (src/export/fold.h). The output is a checkpoint directory (model.safetensors, config.json,
// trainer_state.json naming the source, COMPLETE last) that generate / eval / serve load as usual.
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "export/fold.h"
#include "io/safetensors.h"
#include "model/weights_io.h"
#include "run_setup.h"

namespace {

struct Args {
  std::string checkpoint, out, table_dtype = "f32";
  bool fold = false;
} args;

void run() {
  using namespace jtok;
  namespace fs = std::filesystem;
  if (args.table_dtype != "f32")
    fail("--table-dtype ", args.table_dtype, " is not supported yet (only f32; bf16 / int8 tables are issue 12's next step)");
  if (fs::exists(args.out)) fail("--out ", args.out, " exists; give a new directory");
  LoadedCheckpoint ck = load_for_inference(args.checkpoint);
  int64_t folded = 0;
  if (args.fold) {
    if (!ck.cfg.model.jtok) fail("--fold-jtok: the model in ", ck.dir, " has no JTok layers");
    folded = fold_jtok(ck.model);
    ck.cfg.model = ck.model.cfg;  // jtok_norm = false now
  }
  const fs::path out(args.out), tmp = out.string() + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  StFile st = weights_to_st(ck.model);
  st.metadata["format"] = "pt";
  write_safetensors((tmp / "model.safetensors").string(), st);
  write_file_atomic((tmp / "config.json").string(), to_json(ck.cfg).dump(2) + "\n");
  nlohmann::json state = {{"exported_from", ck.dir}, {"fold_jtok", args.fold}, {"table_dtype", args.table_dtype}};
  write_file_atomic((tmp / "trainer_state.json").string(), state.dump(2) + "\n");
  fsync_dir(tmp.string());
  fs::rename(tmp, out);
  write_file_atomic((out / "COMPLETE").string(), "export\n");
  std::printf("export: %s -> %s (%lld JTok tables folded, tables %s, %.1f MB)\n", ck.dir.c_str(), args.out.c_str(),
              static_cast<long long>(folded), args.table_dtype.c_str(),
              static_cast<double>(fs::file_size(out / "model.safetensors")) / 1e6);
}

void setup(CLI::App* sub) {
  sub->add_option("--checkpoint", args.checkpoint, "checkpoint directory, or a run directory (its newest)")->required();
  sub->add_option("--out", args.out, "new directory for the inference copy")->required();
  sub->add_flag("--fold-jtok", args.fold, "store JTok's gate table G = s * Norm(E) (inference: 1 + G[x])");
  sub->add_option("--table-dtype", args.table_dtype, "table dtype: f32 (bf16 / int8 not yet)");
  sub->callback(run);
}

const bool registered = jtok::register_command({"export", "an inference copy of a checkpoint (--fold-jtok)", setup});

}  // namespace
