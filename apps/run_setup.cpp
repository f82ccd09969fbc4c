#include "run_setup.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cuda/device.h"
#include "model/table_attach.h"
#include "store/table_store.h"
#include "ops/lowp_gemm.h"
#include "train/checkpoint.h"
#include "train/store_export.h"

namespace jtok {

std::map<std::string, std::string>& add_config_field_options(CLI::App* sub) {
  static std::map<std::string, std::string> values;  // one command runs per process
  auto* group = sub->add_option_group("config fields", "any config field, overriding the file (--name value)");
  for (const auto& name : config_field_names()) group->add_option("--" + name, values[name], "");
  return values;
}

std::vector<std::string> collect_overrides(CLI::App* sub, const std::map<std::string, std::string>& fields,
                                           const std::vector<std::string>& sets) {
  std::vector<std::string> out;
  for (const auto& [name, value] : fields)
    if (sub->get_option_group("config fields")->count("--" + name) > 0) out.push_back(name + "=" + value);
  for (const auto& s : sets) out.push_back(s);
  return out;
}

std::string resolve_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) fail("checkpoint ", path, " does not exist");
  if (fs::exists(fs::path(path) / "config.json")) return path;
  if (fs::exists(fs::path(path) / "model.safetensors") && !fs::exists(fs::path(path) / "COMPLETE"))
    fail("checkpoint ", path, " is incomplete (no COMPLETE marker): it was interrupted while being written");
  if (auto latest = latest_checkpoint(path)) return *latest;
  fail(path, " is neither a checkpoint directory (no config.json) nor a run directory with a complete checkpoint");
}

void add_cuda_graphs_option(CLI::App* sub, std::string& value) {
  sub->add_option("--cuda-graphs", value,
                  "--device cuda: on (default: each decode step replayed as a CUDA graph of its batch and length "
                  "bucket) or off (kernels launched one by one; the same bits)")
      ->check(CLI::IsMember({"on", "off"}));
}

void add_int8_decode_option(CLI::App* sub, std::string& value) {
  sub->add_option("--int8-decode", value,
                  "--device cuda, an int8 export (jtok export --weight-dtype int8): on (default: decode steps read "
                  "its int8 matrices as stored, half of bf16's bytes; prefills multiply the bf16 copy), off (the "
                  "bf16 copy alone) or only (the matrices, embedding and LM head in int8 alone, about half the GPU "
                  "memory of the copy; prefills dequantise a layer at a time)")
      ->check(CLI::IsMember({"on", "off", "only"}));
}

void add_pdl_option(CLI::App* sub, std::string& value) {
  sub->add_option("--pdl", value,
                  "--device cuda: programmatic dependent launch in the decode steps' CUDA graphs: off (default) or on "
                  "(a kernel's blocks launch while the one before it finishes; the same bits)")
      ->check(CLI::IsMember({"on", "off"}));
}

void add_tensor_cores_option(CLI::App* sub, std::string& value) {
  sub->add_option("--tensor-cores", value,
                  "--device cuda, bf16: the decode steps' products on the tensor cores: off (default: CUDA-core FMAs) "
                  "or on (each row's bits still its own, whatever the batch, but not the CUDA cores' bits)")
      ->check(CLI::IsMember({"on", "off"}));
}

void set_int8_decode(cuda::DecoderSettings& s, const std::string& value) {
  if (value != "on" && value != "off" && value != "only")
    fail("--int8-decode must be on, off or only, got '", value, "'");
  s.int8_decode = value != "off";
  s.int8_only = value == "only";
}

bool on_off(const std::string& value, const char* flag) {
  if (value != "on" && value != "off") fail(flag, " must be on or off, got '", value, "'");
  return value == "on";
}

bool cuda_graphs_on(const std::string& value) { return on_off(value, "--cuda-graphs"); }

// trainer_state.json's eos_token_ids (written by `jtok import`), those within the vocabulary; empty
// when it has none (a trained checkpoint) or cannot be read.
static std::vector<int32_t> checkpoint_eos_ids(const std::string& dir, int64_t vocab) {
  std::vector<int32_t> ids;
  try {
    const auto j = nlohmann::json::parse(read_file((std::filesystem::path(dir) / "trainer_state.json").string()));
    if (j.is_object() && j.contains("eos_token_ids") && j["eos_token_ids"].is_array())
      for (const auto& v : j["eos_token_ids"])
        if (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab) ids.push_back(v.get<int32_t>());
  } catch (const std::exception&) {
  }
  return ids;
}

// The checkpoint's config, tokenizer and eos ids, and its model with the tables' shapes; tables
// (RAM), mapped, or left without storage (`none`) for the caller to attach.
static LoadedCheckpoint load_checkpoint_for_inference(const std::string& dir, const std::string& tables) {
  if (tables != "none")
    if (const auto store = disk_tables_store(dir))
      fail("checkpoint ", dir, " keeps its token tables in the training table store ", *store,
           " (trained with --tables disk), not in model.safetensors: export them once with `jtok export --checkpoint ", dir,
           " --table-store OUT [--table-dtype bf16|int8|int4]`, then pass --tables disk --table-store OUT");
  Config cfg = load_checkpoint_config(dir);
  // Every value comes from the file; mapped or disk tables get no storage of their own.
  Model m = make_model(cfg.model, 0, {.init = false, .grads = false, .tables = tables == "ram"});
  if (tables == "mmap") load_checkpoint_mapped(dir, m);
  else load_checkpoint(dir, m, nullptr, /*tables=*/tables == "ram");
  // A checkpoint holding its own tokenizer.json (an import) reads it there, wherever the checkpoint
  // has been moved since (its config's tokenizer_dir names where it was written).
  const bool own = cfg.train.tokenizer != "gpt2" && std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json");
  Tokenizer tok = Tokenizer::load(cfg.train.tokenizer, own ? dir : cfg.train.tokenizer_dir);
  std::vector<int32_t> eos = checkpoint_eos_ids(dir, cfg.model.vocab_size);
  if (eos.empty()) eos.push_back(tok.eot_id());
  return {dir, cfg, std::move(m), std::move(tok), std::move(eos)};
}

static LoadedCheckpoint load_for_inference_without_tables(const std::string& dir) {
  return load_checkpoint_for_inference(dir, "none");
}

LoadedCheckpoint load_for_inference(const std::string& checkpoint_or_run, bool map_tables) {
  return load_checkpoint_for_inference(resolve_checkpoint(checkpoint_or_run), map_tables ? "mmap" : "ram");
}

void add_table_source_options(CLI::App* sub, TableSource& src) {
  sub->add_option("--tables", src.kind,
                  "token tables: ram (copied in), mmap (read in place from the checkpoint file) or disk (a token-major "
                  "store, --table-store); --device cuda: hbm too (read into RAM, every table copied to the GPU: "
                  "--table-rows hbm)");
  sub->add_option("--table-store", src.store, "--tables disk: the store directory (jtok export --table-store)");
  sub->add_option("--table-cache-mb", src.cache_mb, "--tables disk: DRAM cache of token rows, MB (default 256)");
  sub->add_option("--table-io-threads", src.io_threads,
                  "--tables disk: threads reading token blocks ahead of need (prompts at admission, tokens as sampled; default 8)");
  sub->add_option("--table-io", src.io,
                  "--tables disk: how the store is read: auto (default: O_DIRECT, whole aligned pages past the page "
                  "cache, where the file system takes it, else pread), direct or pread (through the page cache)");
  sub->add_flag("--table-direct-io", src.direct_io, "--tables disk: the same as --table-io direct");
}

void add_decoder_options(CLI::App* sub, DecoderChoice& c) {
  sub->add_option("--device", c.device, "where the model decodes: cpu (default) or cuda (an NVIDIA GPU; docs/serve.md)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--precision", c.precision,
                  "--device cuda: bf16 (auto, the default: weights and activations in bf16, fp32 accumulation) or fp32")
      ->check(CLI::IsMember({"auto", "bf16", "fp32"}));
  sub->add_option("--table-rows", c.table_rows,
                  "--device cuda: where a step's token-table rows come from: auto (default: in_place where every table "
                  "allows it, else staged), hbm (a GPU copy of every table), in_place (read over PCIe where the host "
                  "keeps them) or staged (gathered by the host into pinned memory, copied)")
      ->check(CLI::IsMember({"auto", "hbm", "in_place", "staged"}));
  add_cuda_graphs_option(sub, c.cuda_graphs);
  add_int8_decode_option(sub, c.int8_decode);
  add_pdl_option(sub, c.pdl);
  add_tensor_cores_option(sub, c.tensor_cores);
}

void check_decoder_choice(const DecoderChoice& c) {
  if (c.device == "cuda") {
    if (c.tensor_cores == "on" && c.precision == "fp32")
      fail("--tensor-cores on multiplies in bf16; --precision fp32 multiplies on the CUDA cores: give one");
    cuda::require_cuda_device();
    return;
  }
  if (c.precision == "bf16") fail("--precision is for --device cuda (the CPU decodes in fp32: bf16 weights are a `jtok export --weight-dtype bf16` checkpoint)");
  if (c.table_rows != "auto") fail("--table-rows is for --device cuda (the CPU reads the rows where --tables keeps them)");
  if (c.cuda_graphs != "on") fail("--cuda-graphs is for --device cuda");
  if (c.int8_decode != "on")
    fail("--int8-decode is for --device cuda (the CPU multiplies an int8 export's matrices as stored)");
  if (c.pdl != "off") fail("--pdl is for --device cuda");
  if (c.tensor_cores != "off") fail("--tensor-cores is for --device cuda");
}

cuda::DecoderSettings decoder_settings(const DecoderChoice& c, bool kv_bf16) {
  cuda::DecoderSettings s;
  s.bf16 = c.precision != "fp32";
  s.kv_bf16 = kv_bf16;
  s.table_rows = c.table_rows;
  s.cuda_graphs = cuda_graphs_on(c.cuda_graphs);
  set_int8_decode(s, c.int8_decode);
  s.pdl = on_off(c.pdl, "--pdl");
  s.tensor_cores = on_off(c.tensor_cores, "--tensor-cores");
  return s;
}

TableIo table_io_option(const std::string& table_io, bool direct_flag, const std::string& tables) {
  const TableIo io = parse_table_io(table_io, "--table-io");
  if (direct_flag && io == TableIo::pread) fail("--table-direct-io and --table-io pread disagree: give one");
  if (direct_flag && tables != "disk") fail("--table-direct-io is for --tables disk");
  if (table_io != "auto" && tables != "disk") fail("--table-io is for --tables disk");
  return direct_flag ? TableIo::direct : io;
}

// A low-precision copy the CPU decodes says on stderr which kernels multiply its matrices on this
// host (the GPU's decoder says what it made of them itself).
static LoadedCheckpoint with_kernels_line(LoadedCheckpoint ck, bool on_cpu) {
  if (on_cpu && ck.model.lowp.any())
    std::fprintf(stderr, "%s\n", lowp_kernels_line(ck.model.lowp.dtype, ck.cfg.model.hidden_size).c_str());
  return ck;
}

void resolve_hbm_tables(TableSource& src, DecoderChoice& c) {
  if (src.kind != "hbm") return;
  if (c.device != "cuda")
    fail(
        "--tables hbm copies every table to the GPU: it needs --device cuda (the CPU reads them from ram, mmap or "
        "disk)");
  if (c.table_rows != "auto" && c.table_rows != "hbm")
    fail("--tables hbm reads every step's rows from the GPU's copy; --table-rows ", c.table_rows,
         " reads them from the host: give one of the two");
  src.kind = "ram";
  src.hbm = true;
  c.table_rows = "hbm";
}

void check_table_source(const TableSource& src) {
  if (src.kind != "ram" && src.kind != "mmap" && src.kind != "disk")
    fail("--tables must be ram, mmap or disk (or hbm with --device cuda, for generate, eval and serve), got '",
         src.kind, "'");
  if ((src.kind == "disk") != !src.store.empty())
    fail(src.kind == "disk" ? "--tables disk needs --table-store DIR" : "--table-store is for --tables disk");
  if (src.cache_mb < 1) fail("--table-cache-mb must be at least 1, got ", src.cache_mb);
  if (src.io_threads < 1 || src.io_threads > 256) fail("--table-io-threads must be in [1, 256], got ", src.io_threads);
  table_io_option(src.io, src.direct_io, src.kind);
}

std::string attach_table_store(Model& m, const TableSource& src, const std::string& whose) {
  const TableIo io = table_io_option(src.io, src.direct_io, src.kind);
  auto store = TableStore::open(src.store, src.cache_mb << 20, src.io_threads, io);
  const std::string reads = describe_table_reads(store->direct_io(), io);
  std::fprintf(stderr, "table store %s: %s; reads with %s\n", src.store.c_str(),
               describe_source(store->source()).c_str(), reads.c_str());
  const std::string manifest = (std::filesystem::path(src.store) / "manifest.json").string();
  attach_disk_rows(m, disk_rows(store), manifest, whose);
  return reads;
}

LoadedCheckpoint load_for_inference(const std::string& checkpoint_or_run, const TableSource& src, bool on_cpu) {
  check_table_source(src);
  if (src.kind != "disk") return with_kernels_line(load_for_inference(checkpoint_or_run, src.kind == "mmap"), on_cpu);
  const std::string dir = resolve_checkpoint(checkpoint_or_run);
  LoadedCheckpoint ck = load_for_inference_without_tables(dir);
  attach_table_store(ck.model, src, "the checkpoint " + dir);
  return with_kernels_line(std::move(ck), on_cpu);
}

}  // namespace jtok
