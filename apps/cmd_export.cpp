// `jtok export`: a checkpoint for inference, in one of two formats:
//   --format jtok (default): an inference copy, a checkpoint directory (model.safetensors,
//     config.json, trainer_state.json naming the source, COMPLETE last) that generate / eval / serve
//     load as usual; --fold-jtok stores JTok's gate table G = s * Norm(E) (src/export/fold.h);
//     --table-dtype bf16 | int8 | int4 stores every token table so (quantize_table, src/model/token_table.h).
//     --table-store DIR instead writes the tables alone as a token-major store (store/table_store.h);
//     of a checkpoint trained with --tables disk, streamed from its training store (train/store_export.h).
//   --format gguf: one GGUF file for llama.cpp's `llama` architecture (docs/formats.md "GGUF
//     export"); models with token-indexed tables or MoE are refused before any weight is read.
//   --format hf: a Hugging Face model directory (src/hf/hf_export.h, docs/import.md), bf16 or f32.
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "export/fold.h"
#include "export/gguf_export.h"
#include "hf/hf_config.h"
#include "hf/hf_export.h"
#include "io/safetensors.h"
#include "store/table_store.h"
#include "model/weights_io.h"
#include "run_setup.h"
#include "train/checkpoint.h"
#include "train/store_export.h"

namespace {

struct Args {
  std::string checkpoint, format = "jtok", out, dtype = "f32", name, table_dtype = "f32", weight_dtype = "f32", table_store;
  bool fold = false;
} args;
CLI::App* self;

// An export reads the fp32 weights; a low-precision copy has only its bf16 / int8 matrices.
void refuse_lowp_source(const jtok::LoadedCheckpoint& ck) {
  if (ck.model.lowp.any())
    jtok::fail("export: ", ck.dir, " holds ", jtok::dtype_name(ck.model.lowp.dtype),
               " weights (itself an export); export from the fp32 checkpoint it came from");
}

// A table store's source (its manifest names it): the checkpoint directory's name and its step
// (trainer_state.json's; an inference copy has none).
jtok::TableStoreSource checkpoint_source(const std::string& dir) {
  jtok::TableStoreSource s;
  s.checkpoint = jtok::dir_basename(dir);
  const std::filesystem::path state = std::filesystem::path(dir) / "trainer_state.json";
  if (std::filesystem::exists(state)) {
    const nlohmann::json j = nlohmann::json::parse(jtok::read_file(state.string()), nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer()) s.step = j["step"].get<int64_t>();
  }
  return s;
}

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
  refuse_lowp_source(ck);
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
  refuse_lowp_source(ck);
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

void export_jtok() {
  using namespace jtok;
  namespace fs = std::filesystem;
  if (self->count("--dtype") || self->count("--name")) fail("export: --dtype and --name are for --format gguf");
  const Dtype tdt = parse_dtype(args.table_dtype, "--table-dtype", {Dtype::f32, Dtype::bf16, Dtype::int8, Dtype::int4});
  if (args.table_store.empty() == args.out.empty()) fail("export: give --out DIR, or --table-store DIR (not both)");
  if (!args.out.empty() && fs::exists(args.out)) fail("--out ", args.out, " exists; give a new directory");
  if (!args.table_store.empty() && fs::exists(args.table_store))
    fail("--table-store ", args.table_store, " exists; give a new directory");
  if (const std::string dir = resolve_checkpoint(args.checkpoint); disk_tables_store(dir)) {
    export_disk_trained(dir, tdt);
    return;
  }
  LoadedCheckpoint ck = load_for_inference(args.checkpoint);
  refuse_lowp_source(ck);
  for (const auto& t : ck.model.tables)
    if (t.dtype() != Dtype::f32)
      fail("export: ", ck.dir, " already has ", dtype_name(t.dtype()), " tables; export from the f32 checkpoint");
  int64_t folded = 0;
  if (args.fold) {
    if (!ck.cfg.model.jtok) fail("--fold-jtok: the model in ", ck.dir, " has no JTok layers");
    folded = fold_jtok(ck.model);
    ck.cfg.model = ck.model.cfg;  // jtok_norm = false now
  }
  // bf16 / int8 / int4 (symmetric, per-row scale) tables, JTok's (folded or not) and JTok-M's alike.
  if (tdt != Dtype::f32)
    for (auto& t : ck.model.tables) t = quantize_table(t, tdt);
  if (!args.table_store.empty()) {  // the tables alone, token-major, for --tables disk
    if (ck.model.tables.empty()) fail("--table-store: the model in ", ck.dir, " has no token tables");
    if (args.fold) fail("--table-store: --fold-jtok changes the backbone; export the folded checkpoint first");
    const TableStoreSource source = checkpoint_source(ck.dir);
    write_table_store(args.table_store, ck.model.tables, ck.model.table_names, source);
    std::printf("export: %s -> %s (token-major table store, %zu tables, %s, %.1f MB; %s)\n", ck.dir.c_str(),
                args.table_store.c_str(), ck.model.tables.size(), args.table_dtype.c_str(),
                static_cast<double>(fs::file_size(fs::path(args.table_store) / "tables.bin")) / 1e6,
                describe_source(source).c_str());
    return;
  }
  const fs::path out(args.out), tmp = out.string() + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  StFile st = weights_to_st(ck.model);
  convert_to_lowp(st, ck.cfg.model, parse_dtype(args.weight_dtype, "--weight-dtype"));  // f32: unchanged
  st.metadata["format"] = "pt";
  write_safetensors((tmp / "model.safetensors").string(), st);
  write_file_atomic((tmp / "config.json").string(), to_json(ck.cfg).dump(2) + "\n");
  nlohmann::json state = {{"exported_from", ck.dir}, {"fold_jtok", args.fold}, {"table_dtype", args.table_dtype},
                          {"weight_dtype", args.weight_dtype}};
  if (fs::exists(fs::path(ck.dir) / "tokenizer.json")) {  // an imported model's own tokenizer and eos ids go along
    state["eos_token_ids"] = ck.eos_ids;
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"})
      if (fs::exists(fs::path(ck.dir) / name))
        write_file_atomic((tmp / name).string(), read_file((fs::path(ck.dir) / name).string()));
  }
  write_file_atomic((tmp / "trainer_state.json").string(), state.dump(2) + "\n");
  fsync_dir(tmp.string());
  fs::rename(tmp, out);
  write_file_atomic((out / "COMPLETE").string(), "export\n");
  std::printf("export: %s -> %s (%lld JTok tables folded, weights %s, tables %s, %.1f MB)\n", ck.dir.c_str(),
              args.out.c_str(), static_cast<long long>(folded), args.weight_dtype.c_str(), args.table_dtype.c_str(),
              static_cast<double>(fs::file_size(out / "model.safetensors")) / 1e6);
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

}  // namespace
