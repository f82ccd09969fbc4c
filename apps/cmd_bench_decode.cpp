// `jtok bench-decode`: greedy decoding of M sequences together through the Decoder (infer/decoder.h)
// on the CPU or a GPU, timed (infer/bench_decode.h says what each figure is). The model: a random
// one from --config and --set (make_inference_model: make_model's backbone, the tables' values by the
// hash or, --table-values init, make_model's; no checkpoint on disk; tables in RAM as f32 or bf16, or
// with --tables disk --table-store DIR in a store written there from the same values), or a
// checkpoint (--tables ram | mmap | disk as `jtok generate`). One human line a run on stderr, one JSON
// line a run on stdout. bench/gpu_decode_peer.sh runs it.
// --cuda-graphs off times the GPU decoder's eager steps; JTOK_PROFILE=1 adds each step's breakdown,
// JTOK_KERNEL_TRACE=FILE a traced run of each shape (infer/bench_decode.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cuda/kernel_trace_file.h"
#include "infer/bench_decode.h"
#include "infer/generate.h"
#include "infer/random_table_store.h"
#include "model/inference_model.h"
#include "model/lowp_weights.h"
#include "run_setup.h"
#include "scaling/memory_plan.h"

namespace cmd_bench_decode {

struct Args {
  std::string config, checkpoint, table_dtype = "f32", precision = "auto", kv_dtype = "auto", cuda_graphs = "on";
  std::string table_values = "hash", weight_dtype = "f32", int8_decode = "on", pdl = "off", tensor_cores = "off";
  std::vector<std::string> sets, table_rows;
  jtok::TableSource tables;
  jtok::BenchDecodeOptions bench;
};
Args args;

// A random model of --config + --set, after its memory plan is printed (and refused where the
// tables alone would not fit in the RAM available).
jtok::Model random_model(const jtok::Config& cfg, jtok::Dtype dt, jtok::TableValues values, nlohmann::json& about) {
  const jtok::ModelConfig& c = cfg.model;
  const int64_t tables = jtok::token_table_count(c);
  const double gb = 1e-9, need = static_cast<double>(jtok::table_bytes(c, dt)), ram = static_cast<double>(std::max<int64_t>(0, jtok::mem_available_bytes()));
  std::fprintf(stderr, "bench-decode: %lld token tables of %lld x %lld in %s: %.2f GB (f32 %.2f GB); RAM available %.1f GB\n",
               static_cast<long long>(tables), static_cast<long long>(c.padded_vocab()),
               static_cast<long long>(c.hidden_size), jtok::dtype_name(dt), need * gb,
               static_cast<double>(jtok::table_bytes(c, jtok::Dtype::f32)) * gb, ram * gb);
  if (ram > 0 && need > 0.9 * ram)
    jtok::fail("bench-decode: the tables (", need * gb, " GB in ", jtok::dtype_name(dt), ") do not fit in the ", ram * gb,
               " GB of RAM available", dt == jtok::Dtype::f32 ? " (--table-dtype bf16 halves them)" : "");
  const auto t0 = std::chrono::steady_clock::now();
  jtok::Model m = jtok::make_inference_model(c, cfg.train.seed, dt, values);
  about["init_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  about.update({{"config", args.config}, {"sets", args.sets}, {"tables_in", "ram"}, {"seed", cfg.train.seed}});
  return m;
}

// A random model of --config + --set whose tables are a store on disk (--tables disk --table-store
// DIR): written there first with the tables' values (--table-values) when DIR holds none (its bytes
// and seconds in the JSON), then opened as `generate --tables disk` opens one. The tables never exist
// in RAM.
jtok::Model random_model_on_disk(const jtok::Config& cfg, jtok::Dtype dt, jtok::TableValues values,
                                 nlohmann::json& about) {
  namespace fs = std::filesystem;
  const jtok::TableSource& src = args.tables;
  jtok::check_table_source(src);
  jtok::Model m = jtok::make_inference_model_without_tables(cfg.model, cfg.train.seed);
  if (!fs::exists(fs::path(src.store) / "manifest.json")) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t bytes = jtok::write_random_table_store(m, cfg.train.seed, dt, src.store, values);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr,
                 "bench-decode: wrote the table store %s: %.2f GB in %.1f s (%.2f GB/s, rows made and written)\n",
                 src.store.c_str(), static_cast<double>(bytes) * 1e-9, s, static_cast<double>(bytes) * 1e-9 / s);
    about.update({{"store_write_s", s}, {"store_bytes", bytes}});
  }
  const std::string reads = jtok::attach_table_store(m, src, "the random model of " + args.config);
  about.update({{"config", args.config},
                {"sets", args.sets},
                {"tables_in", "disk"},
                {"table_store", src.store},
                {"table_reads", reads},
                {"table_cache_mb", src.cache_mb},
                {"seed", cfg.train.seed}});
  return m;
}

// What every JSON line says of the model.
void describe_model(const jtok::Model& m, jtok::Dtype dt, nlohmann::json& about) {
  const jtok::ModelConfig& c = m.cfg;
  int64_t table_bytes = 0;
  for (const jtok::TokenTable& t : m.tables) table_bytes += t.storage_bytes();
  about.update({{"layers", c.num_hidden_layers}, {"hidden_size", c.hidden_size}, {"vocab_size", c.vocab_size},
                {"params", jtok::num_params(m)}, {"backbone_params", m.params.size()}, {"jtok", c.jtok}, {"jtokm", c.jtokm},
                {"jtokm_n_e", c.jtokm ? c.jtokm_n_e : 0}, {"jtokm_top_k", c.jtokm ? c.jtokm_top_k : 0},
                {"jtokm_layers", c.jtokm ? c.jtokm_num_layers() : 0}, {"tables", m.tables.size()},
                {"table_dtype", m.tables.empty() ? jtok::dtype_name(dt) : jtok::dtype_name(m.tables[0].dtype())},
                {"table_gb", static_cast<double>(table_bytes) * 1e-9}});
}

void run() {
  if (args.config.empty() == args.checkpoint.empty()) jtok::fail("bench-decode: give --config or --checkpoint (one)");
  jtok::BenchDecodeOptions& b = args.bench;
  const bool cuda = b.device == "cuda";
  const std::string precision = args.precision == "auto" ? (cuda ? "bf16" : "fp32") : args.precision;
  if (!cuda && precision == "bf16")
    jtok::fail("bench-decode: --precision bf16 is the GPU decoder's; the CPU engine decodes in fp32 "
               "(bf16 weights: a `jtok export --weight-dtype bf16` checkpoint)");
  b.settings.bf16 = precision == "bf16";
  b.settings.kv_bf16 = jtok::parse_dtype(args.kv_dtype == "auto" ? (cuda ? "bf16" : "f32") : args.kv_dtype, "--kv-dtype",
                                         jtok::kKvDtypes) == jtok::Dtype::bf16;
  if (!cuda && !args.table_rows.empty()) jtok::fail("bench-decode: --table-rows is for --device cuda");
  if (args.tables.kind == "hbm")
    jtok::fail(
        "bench-decode: --tables says where the model's tables live (ram, mmap or disk); the GPU's copy of "
        "them is --table-rows hbm");
  if (!cuda && args.cuda_graphs != "on") jtok::fail("bench-decode: --cuda-graphs is for --device cuda");
  if (!cuda && args.int8_decode != "on") jtok::fail("bench-decode: --int8-decode is for --device cuda");
  if (!cuda && args.pdl != "off") jtok::fail("bench-decode: --pdl is for --device cuda");
  if (!cuda && args.tensor_cores != "off") jtok::fail("bench-decode: --tensor-cores is for --device cuda");
  b.settings.cuda_graphs = jtok::cuda_graphs_on(args.cuda_graphs);
  jtok::set_int8_decode(b.settings, args.int8_decode);
  b.settings.pdl = jtok::on_off(args.pdl, "--pdl");
  b.settings.tensor_cores = jtok::on_off(args.tensor_cores, "--tensor-cores");
  b.table_rows = args.table_rows;
  const jtok::Dtype dt = jtok::parse_dtype(args.table_dtype, "--table-dtype", {jtok::Dtype::f32, jtok::Dtype::bf16});
  nlohmann::json about;
  jtok::Model model;
  if (!args.config.empty()) {
    if (args.tables.kind == "mmap")
      jtok::fail("bench-decode: --tables mmap reads a checkpoint's file; it needs --checkpoint");
    const jtok::Config cfg = jtok::load_config(args.config, args.sets);
    const jtok::TableValues values = jtok::parse_table_values(args.table_values, "--table-values");
    about["table_values"] = args.table_values;
    model = args.tables.kind == "disk" ? random_model_on_disk(cfg, dt, values, about)
                                       : random_model(cfg, dt, values, about);
    // Its matrices as an export's (`jtok export --weight-dtype`) would load.
    jtok::convert_model_to_lowp(model, jtok::parse_dtype(args.weight_dtype, "--weight-dtype"));
    about["weight_dtype"] = args.weight_dtype;
  } else {
    if (!args.sets.empty() || args.table_dtype != "f32" || args.table_values != "hash" || args.weight_dtype != "f32")
      jtok::fail(
          "bench-decode: --set, --table-dtype, --table-values and --weight-dtype are for a random model "
          "(--config; a checkpoint's matrices are what `jtok export --weight-dtype` made them)");
    jtok::LoadedCheckpoint ck = jtok::load_for_inference(args.checkpoint, args.tables, !cuda);
    about.update({{"checkpoint", ck.dir}, {"tables_in", args.tables.kind}});
    model = std::move(ck.model);
  }
  describe_model(model, dt, about);
  b.model = about;
  b.kernel_trace = jtok::cuda::kernel_trace_path_from_env();
  jtok::bench_decode(model, b, [](const nlohmann::json& j) {
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  });
}

void setup(CLI::App* sub) {
  jtok::BenchDecodeOptions& b = args.bench;
  sub->add_option("--config", args.config, "config JSON of a random model (no checkpoint needed)");
  sub->add_option("--set", args.sets, "override a config field of the random model: name=value (repeatable)");
  sub->add_option(
      "--table-dtype", args.table_dtype,
      "a random model's tables (in RAM, or in the store --tables disk writes): f32 (default) or bf16 (half the "
      "bytes)");
  sub->add_option("--table-values", args.table_values,
                  "a random model's table values: hash (default: each a function of the seed, table and index, "
                  "~N(0, std); made ~13x faster) or init (make_model's init streams, the values training starts from)");
  sub->add_option("--weight-dtype", args.weight_dtype,
                  "a random model's matrices: f32 (default), bf16 or int8, as `jtok export --weight-dtype` makes "
                  "them (the GPU: bf16 weights from either; int8 decode steps read the int8 matrices, --int8-decode)");
  sub->add_option("--checkpoint", args.checkpoint, "a checkpoint instead of --config (or a run directory: its newest)");
  jtok::add_table_source_options(sub, args.tables);
  sub->add_option("--device", b.device, "cpu (default) or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--precision", args.precision, "cuda: bf16 (default) or fp32; the CPU engine: fp32")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  sub->add_option("--kv-dtype", args.kv_dtype, "KV cache: f32 or bf16 (default: bf16 on cuda, f32 on the CPU)");
  sub->add_option("--table-rows", args.table_rows,
                  "cuda: where a step's table rows come from, a decoder each in turn: hbm, in_place, staged, auto "
                  "(comma-separated; default auto)")
      ->delimiter(',');
  jtok::add_cuda_graphs_option(sub, args.cuda_graphs);
  jtok::add_int8_decode_option(sub, args.int8_decode);
  jtok::add_pdl_option(sub, args.pdl);
  jtok::add_tensor_cores_option(sub, args.tensor_cores);
  sub->add_option("--batch", b.batches, "sequences decoded together, a run each (comma-separated; default 1)")->delimiter(',');
  sub->add_option("--prompt-len", b.prompt_len, "prompt tokens of each sequence (default 512)");
  sub->add_option("--new-tokens", b.new_tokens, "decode steps after the prefill (default 128)");
  sub->add_option("--long-prompt", b.long_prompt, "also prefill one prompt of this many tokens (0: none, the default)");
  sub->add_option("--max-prefill", b.max_prefill, "the longest prefill call; a long prompt goes in pieces (default 4096)");
  sub->add_option("--warmup", b.warmup, "untimed runs of every shape first (default 1)");
  sub->add_option("--repeat", b.repeat, "timed runs of each shape; medians reported (default 3)");
  sub->add_option("--data", b.data, "token shards the prompts come from (default data/train)");
  sub->footer(
      "Environment (--device cuda): JTOK_PROFILE=1 adds each decode step's breakdown (eager steps, events between "
      "phases); JTOK_KERNEL_TRACE=FILE runs each shape once more after its timed runs with the device's kernels, "
      "copies and memsets recorded, as CSV in FILE's stem + -ROWS-bM.csv or -ROWS-prefill.csv (CUPTI: "
      "bench/gpu_kernels_report.py reads them).");
  sub->callback(run);
}

const bool registered = jtok::register_command(
    {"bench-decode", "time greedy decoding of batched prompts through the CPU or GPU decoder (throughput benchmark)", setup});

}  // namespace cmd_bench_decode
