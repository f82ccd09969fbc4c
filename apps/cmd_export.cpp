// `jtok export`: a checkpoint for inference, in one of three formats (the flags parsed and checked
// here, the work in src/):
//   --format jtok (default): an inference copy (src/export/inference_copy.h), a checkpoint directory
//     (model.safetensors, config.json, trainer_state.json naming the source, COMPLETE) published whole
//     (publish_dir_atomic) that generate / eval / serve load as usual; --fold-jtok stores JTok's gate table G = s * Norm(E) (src/export/fold.h);
//     --table-dtype bf16 | int8 | int4 stores every token table so (quantize_table, src/model/token_table.h).
//     --table-store DIR instead writes the tables alone as a token-major store (store/table_store.h);
//     of a checkpoint trained with --tables disk, streamed from its training store (train/store_export.h).
//   --format gguf: one GGUF file for llama.cpp's `llama` architecture (docs/formats.md "GGUF
//     export"); models with token-indexed tables or MoE are refused before any weight is read.
//   --format hf: a Hugging Face model directory (src/hf/hf_export.h, docs/import.md), bf16 or f32.
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "core/error.h"
#include "export/gguf_export.h"
#include "export/inference_copy.h"
#include "hf/hf_config.h"
#include "hf/hf_export.h"
#include "run_setup.h"
#include "store/table_store.h"
#include "train/checkpoint.h"
#include "train/store_export.h"

namespace cmd_export {

struct Args {
  std::string checkpoint, format = "jtok", out, dtype = "f32", name, table_dtype = "f32", weight_dtype = "f32", table_store;
  bool fold = false;
} args;
CLI::App* self;

void export_gguf() {
  if (args.out.empty() || !args.table_store.empty()) jtok::fail("export --format gguf: give --out (--table-store is for --format jtok)");
  using namespace jtok;
  if (args.dtype == "bf16") fail("export --format gguf: --dtype bf16 (known: f32, f16, q8_0)");
  if (args.fold || self->count("--table-dtype") || self->count("--weight-dtype"))
    fail("export: --fold-jtok, --table-dtype and --weight-dtype are for --format jtok");
  const std::string dir = resolve_checkpoint(args.checkpoint);
  const Config cfg = load_checkpoint_config(dir);  // refuse before reading any weights
  if (std::string why = gguf_unsupported_reason(cfg.model); !why.empty())
    fail("export: ", dir, " cannot be exported as GGUF: ", why);
  LoadedCheckpoint ck = load_for_inference(dir);
  refuse_lowp_source(ck.model, ck.dir);
  GgufExportOptions opt;
  opt.dtype = args.dtype == "f16" ? GgmlType::F16 : args.dtype == "q8_0" ? GgmlType::Q8_0 : GgmlType::F32;
  opt.tokenizer = ck.cfg.train.tokenizer;
  // An imported checkpoint's own tokenizer.json, wherever the checkpoint is now.
  opt.tokenizer_dir = std::filesystem::exists(std::filesystem::path(ck.dir) / "tokenizer.json") && opt.tokenizer != "gpt2"
                          ? ck.dir
                          : ck.cfg.train.tokenizer_dir;
  opt.name = args.name;
  GgufWriter w;
  build_gguf(ck.model, opt, w);
  w.write(args.out);
  std::printf("export: %s -> %s (gguf v%u, %s, %s, %llu bytes)\n", ck.dir.c_str(), args.out.c_str(), kGgufVersion,
              gguf_architecture(ck.cfg.model).c_str(), args.dtype.c_str(), static_cast<unsigned long long>(w.file_size()));
}

// The directory whose tokenizer.json an HF export copies: the checkpoint's own (an import), else a
// Qwen3-kind tokenizer's directory; "" for GPT-2's files (no tokenizer.json).
std::string tokenizer_json_dir(const jtok::LoadedCheckpoint& ck) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(ck.dir) / "tokenizer.json")) return ck.dir;
  if (ck.cfg.train.tokenizer != "qwen3") return "";
  return ck.cfg.train.tokenizer_dir.empty() ? jtok::default_tokenizer_dir("qwen3") : ck.cfg.train.tokenizer_dir;
}

void export_hf() {
  if (args.out.empty() || !args.table_store.empty()) jtok::fail("export --format hf: give --out (--table-store is for --format jtok)");
  using namespace jtok;
  if (args.fold || self->count("--table-dtype") || self->count("--weight-dtype") || self->count("--name"))
    fail("export: --fold-jtok, --table-dtype, --weight-dtype and --name are not for --format hf");
  HfExportOptions opt;
  opt.dtype = self->count("--dtype") ? args.dtype : "bf16";
  if (opt.dtype != "bf16" && opt.dtype != "f32") fail("export --format hf: --dtype ", opt.dtype, " (known: bf16, f32)");
  if (std::filesystem::exists(args.out)) fail("--out ", args.out, " exists; give a new directory");
  const std::string dir = resolve_checkpoint(args.checkpoint);
  hf_config_from_model(load_checkpoint_config(dir).model, dir);  // refuse before reading any weights
  LoadedCheckpoint ck = load_for_inference(dir);
  refuse_lowp_source(ck.model, ck.dir);
  opt.tokenizer_dir = tokenizer_json_dir(ck);
  opt.eos_token_id = ck.tokenizer.eot_id();
  const uint64_t bytes = export_hf(ck.model, ck.dir, args.out, opt);
  std::printf("export: %s -> %s (Hugging Face %s, %s, %.1f MB, tokenizer %s)\n", ck.dir.c_str(), args.out.c_str(),
              hf_config_from_model(ck.model.cfg, ck.dir).value("model_type", "").c_str(), opt.dtype.c_str(),
              static_cast<double>(bytes) / 1e6, opt.tokenizer_dir.empty() ? "not copied (no tokenizer.json)" : "copied");
}

// A checkpoint trained with --tables disk: its tables are in a training store, never whole in memory.
// --table-store streams them into a read-only store (train/store_export.h); an inference copy
// (--out) would hold them whole in model.safetensors, so it is refused, saying what to run.
void export_disk_trained(const std::string& dir, jtok::Dtype tdt) {
  using namespace jtok;
  const std::string store = *disk_tables_store(dir);
  if (args.table_store.empty() || args.fold || self->count("--weight-dtype"))
    fail("export: checkpoint ", dir, " keeps its token tables in the training table store ", store,
         " (trained with --tables disk), not in model.safetensors; an inference copy (--out, --fold-jtok, --weight-dtype) ",
         "would hold them whole in memory. Export the tables with `jtok export --checkpoint ", dir,
         " --table-store OUT [--table-dtype bf16|int8|int4]` and run eval / generate / serve --checkpoint ", dir,
         " --tables disk --table-store OUT");
  const Config cfg = load_checkpoint_config(dir);  // the tables' names and shapes; no weight is read
  const Model m = make_model(cfg.model, 0, {.init = false, .grads = false, .tables = false});
  const StoreExportStats s = export_disk_tables(dir, m, args.table_store, tdt);
  std::printf("export: %s -> %s (token-major table store, %lld tables, %s, %.1f MB; from the training store %s at its "
              "step: %lld units from its undo log, %lld rows brought current)\n",
              dir.c_str(), args.table_store.c_str(), static_cast<long long>(s.tables), args.table_dtype.c_str(),
              static_cast<double>(std::filesystem::file_size(std::filesystem::path(args.table_store) / "tables.bin")) / 1e6,
              store.c_str(), static_cast<long long>(s.units_from_log), static_cast<long long>(s.rows_replayed));
}

// --format jtok's options, checked; the flags of other formats refused.
jtok::InferenceCopyOptions inference_copy_options() {
  using namespace jtok;
  if (self->count("--dtype") || self->count("--name")) fail("export: --dtype and --name are for --format gguf");
  if (args.table_store.empty() == args.out.empty()) fail("export: give --out DIR, or --table-store DIR (not both)");
  if (!args.out.empty() && std::filesystem::exists(args.out)) fail("--out ", args.out, " exists; give a new directory");
  if (!args.table_store.empty() && std::filesystem::exists(args.table_store))
    fail("--table-store ", args.table_store, " exists; give a new directory");
  InferenceCopyOptions opt;
  opt.fold_jtok = args.fold;
  opt.table_dtype = parse_dtype(args.table_dtype, "--table-dtype", {Dtype::f32, Dtype::bf16, Dtype::int8, Dtype::int4});
  opt.weight_dtype = parse_dtype(args.weight_dtype, "--weight-dtype");
  return opt;
}

// --table-store: the tables alone, token-major, for --tables disk.
void export_table_store(const jtok::LoadedCheckpoint& ck) {
  using namespace jtok;
  if (ck.model.tables.empty()) fail("--table-store: the model in ", ck.dir, " has no token tables");
  const TableStoreSource source = checkpoint_source(ck.dir);
  write_table_store(args.table_store, ck.model.tables, ck.model.table_names, source);
  std::printf("export: %s -> %s (token-major table store, %zu tables, %s, %.1f MB; %s)\n", ck.dir.c_str(),
              args.table_store.c_str(), ck.model.tables.size(), args.table_dtype.c_str(),
              static_cast<double>(std::filesystem::file_size(std::filesystem::path(args.table_store) / "tables.bin")) / 1e6,
              describe_source(source).c_str());
}

void export_jtok() {
  using namespace jtok;
  const InferenceCopyOptions opt = inference_copy_options();
  if (const std::string dir = resolve_checkpoint(args.checkpoint); disk_tables_store(dir)) {
    export_disk_trained(dir, opt.table_dtype);
    return;
  }
  if (!args.table_store.empty() && args.fold)
    fail("--table-store: --fold-jtok changes the backbone; export the folded checkpoint first");
  LoadedCheckpoint ck = load_for_inference(args.checkpoint);
  refuse_lowp_source(ck.model, ck.dir);
  const int64_t folded = prepare_export_model(ck.model, ck.cfg.model, ck.dir, opt);
  if (!args.table_store.empty()) return export_table_store(ck);
  write_inference_copy(ck.model, ck.cfg, ck.dir, ck.eos_ids, args.out, opt);
  std::printf("export: %s -> %s (%lld JTok tables folded, weights %s, tables %s, %.1f MB)\n", ck.dir.c_str(),
              args.out.c_str(), static_cast<long long>(folded), args.weight_dtype.c_str(), args.table_dtype.c_str(),
              static_cast<double>(std::filesystem::file_size(std::filesystem::path(args.out) / "model.safetensors")) / 1e6);
}

void setup(CLI::App* sub) {
  self = sub;
  sub->add_option("--checkpoint", args.checkpoint, "checkpoint directory, or a run directory (its newest)")->required();
  sub->add_option("--format", args.format,
                  "jtok: an inference checkpoint directory; gguf: a file for llama.cpp; hf: a Hugging Face model directory")
      ->check(CLI::IsMember({"jtok", "gguf", "hf"}));
  sub->add_option("--out", args.out, "output: a new directory (jtok) or file (gguf), written under a temp name");
  sub->add_option("--table-store", args.table_store,
                  "jtok: instead of --out, write the token tables alone as a token-major store for --tables disk "
                  "(a new directory; --table-dtype applies); of a checkpoint trained with --tables disk, streamed from "
                  "its training store");
  sub->add_flag("--fold-jtok", args.fold, "jtok: store JTok's gate table G = s * Norm(E) (inference: 1 + G[x])");
  sub->add_option("--table-dtype", args.table_dtype,
                  "jtok: token-table storage: f32, bf16, int8 or int4 (symmetric, one scale a row; int4: two values a "
                  "byte, levels -7..7); inference only")
      ->check(CLI::IsMember({"f32", "bf16", "int8", "int4"}));
  sub->add_option("--weight-dtype", args.weight_dtype,
                  "jtok: dtype of the attention / MLP projections, MoE experts, embedding and LM head: f32, bf16, or int8 "
                  "(symmetric, one scale per output row); inference only")
      ->check(CLI::IsMember({"f32", "bf16", "int8"}));
  sub->add_option("--dtype", args.dtype,
                  "gguf: type of the 2-D weights (norms stay f32): f32, f16, or q8_0 (llama.cpp's 8-bit blocks of 32); "
                  "hf: every tensor's dtype: bf16 (default) or f32 (exact)")
      ->check(CLI::IsMember({"f32", "f16", "q8_0", "bf16"}));
  sub->add_option("--name", args.name, "gguf: general.name in the file (default: jtok)");
  sub->callback([] { args.format == "gguf" ? export_gguf() : args.format == "hf" ? export_hf() : export_jtok(); });
}

const bool registered = jtok::register_command(
    {"export", "export a checkpoint for inference: an inference copy (--fold-jtok), GGUF for llama.cpp, or a Hugging Face directory", setup});

}  // namespace cmd_export
