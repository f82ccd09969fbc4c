// `jtok train`: trains a model on token shards (README "Commands").
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "commands.h"
#include "core/error.h"
#include "core/peak_flops.h"
#include "cuda/device.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "dist/communicator.h"
#include "run_setup.h"
#include "scaling/flops.h"
#include "scaling/memory_plan.h"
#include "train/batch_prefetch.h"
#include "train/config.h"
#include "train/init_from.h"
#include "train/precision.h"
#include "train/trainer.h"

namespace cmd_train {

struct Args {
  std::string config, out;
  std::vector<std::string> sets;
  int64_t max_steps = -1;
  bool resume = false, overwrite = false, no_checkpoints = false, validate = false;
  int64_t skip_nonfinite_steps = 0;
  double peak_gflops = -1;
  std::string sample_prompt = "The";
  std::string embp = "off", embp_owner = "mod";
  double dist_timeout = 600;
  std::string grad_overlap = "on";
  std::string embp_overlap = "on";
  std::string init_from, train_only;
  std::string tables = "ram", table_store;
  int64_t table_cache_mb = 256;
  int table_io_threads = 4;
  bool table_direct_io = false;
  std::string table_io = "auto";
  double table_lr = -1;
  bool no_memory_check = false;
  std::string device = "cpu";
} args;
std::map<std::string, std::string>* fields;
CLI::App* self;

// Whether the config file or an override sets `field` (explicitly, not by default).
bool field_set(const std::string& path, const std::vector<std::string>& overrides, const std::string& field) {
  for (const auto& o : overrides)
    if (o.rfind(field + "=", 0) == 0) return true;
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains(field);
}

// --init-from's checkpoint resolved (a run directory: its newest complete one); "" without it.
std::string resolve_init_from() {
  using namespace jtok;
  if (args.init_from.empty()) return "";
  std::string dir;
  try {
    dir = resolve_checkpoint(args.init_from);
  } catch (const Error& e) {
    fail("--init-from: ", e.what());
  }
  namespace fs = std::filesystem;
  const std::string out = fs::weakly_canonical(args.out).string() + "/";
  if (args.overwrite && fs::weakly_canonical(dir).string().rfind(out, 0) == 0)
    fail("--init-from ", dir, " lies inside --out ", args.out, ", which --overwrite would delete: pick another --out");
  return dir;
}

// --init-from: cfg checked against the checkpoint and its attached modules' scalers set to 0
// (train/init_from.h). A scaler init counts as set only in --config or an override: the
// checkpoint's own config.json (the default config) writes every field.
void prepare_init_from(jtok::Config& cfg, const std::vector<std::string>& overrides, const std::string& dir) {
  using namespace jtok;
  if (dir.empty()) return;
  const InitFromPlan plan = plan_init_from(dir, cfg.model, field_set(args.config, overrides, "jtok_scale_init"),
                                           field_set(args.config, overrides, "jtokm_scale_init"));
  std::printf("%s\n", plan.describe().c_str());
}

// What this run holds per process; with --no-checkpoints nothing is written, so no write copies.
jtok::MemoryPlan train_memory_plan(const jtok::Config& cfg) {
  const int64_t ranks = args.embp != "off" ? jtok::dist::world_size() : 1;
  const int64_t B = cfg.train.micro_batch_size, T = cfg.train.seq_len;
  jtok::MemoryPlan plan = args.device == "cuda" ? jtok::host_plan_of_device_run(cfg, B, T) : jtok::memory_plan(cfg, B, T, ranks);
  if (args.no_checkpoints) plan.checkpoint = 0;
  return plan;
}

// A memory plan that does not fit: refused, or noted and gone on with under --no-memory-check.
void refuse_unless_forced(const std::string& why) {
  if (!args.no_memory_check) jtok::fail(why, " (--no-memory-check to try anyway)");
  std::printf("memory: %s (--no-memory-check: going on)\n", why.c_str());
}

// --device cuda: the GPU's plan, printed; a plan beyond the device's memory is refused (before any
// allocation fails deep inside the set-up).
void check_gpu_memory_plan(const jtok::Config& cfg) {
  using namespace jtok;
  const MemoryPlan plan = device_memory_plan(cfg, cfg.train.micro_batch_size, cfg.train.seq_len);
  std::printf("GPU memory plan:\n%s", memory_plan_text(plan, "  ").c_str());
  const cuda::DeviceInfo d = cuda::require_cuda_device();
  if (plan.total() <= d.memory_bytes) return;
  refuse_unless_forced("the GPU plan needs " + std::to_string(plan.total() >> 20) + " MiB, " + d.name + " has " +
                       std::to_string(d.memory_bytes >> 20) + " MiB (fewer or smaller tables, a smaller micro_batch_size)");
}

// The plan's memory, printed; a plan beyond MemAvailable is refused naming what to shrink.
void check_memory_plan(const jtok::Config& cfg) {
  using namespace jtok;
  const MemoryPlan plan = train_memory_plan(cfg);
  std::printf("memory plan (%s):\n%s", args.device == "cuda" ? "host" : "per process", memory_plan_text(plan, "  ").c_str());
  const int64_t avail = mem_available_bytes();
  // Under mpirun every rank of this machine needs its share: compare a rank's plan with 1/P of it.
  const int64_t share = avail < 0 ? -1 : avail / std::max(1, dist::world_size());
  const std::string why = memory_plan_refusal(plan, cfg, share);
  if (!why.empty()) refuse_unless_forced(why);
  if (args.device == "cuda") check_gpu_memory_plan(cfg);
}

// The config file (default with --init-from: the checkpoint's config.json) with the --set / option
// overrides, and the overrides themselves.
jtok::Config load_train_config(std::vector<std::string>& overrides, const std::string& init_dir) {
  overrides = jtok::collect_overrides(self, *fields, args.sets);
  if (args.max_steps > 0) overrides.push_back("max_steps=" + std::to_string(args.max_steps));
  if (!args.train_only.empty()) overrides.push_back("train_only=" + args.train_only);
  if (args.table_lr >= 0) {
    char lr[32];
    std::snprintf(lr, sizeof lr, "%.17g", args.table_lr);
    overrides.push_back(std::string("table_learning_rate=") + lr);
  }
  if (!args.config.empty()) return jtok::load_config(args.config, overrides);
  if (init_dir.empty()) jtok::fail("train: --config is required (or --init-from CKPT: its config.json is then the default)");
  std::printf("init-from: the run's config is %s/config.json (no --config) with the command's overrides\n", init_dir.c_str());
  return jtok::init_from_config(init_dir, overrides);
}

// The log's header: the command, the resolved config, the parameter and FLOP counts.
void print_run_header(const jtok::Config& cfg, const jtok::FlopsReport& fr) {
  const auto& t = cfg.train;
  std::printf("command: %s\n", jtok::command_line_string().c_str());
  std::printf("config: %s\n", jtok::to_json(cfg).dump().c_str());
  std::printf("params: total %.2fM | N_c %.2fM (attention %.2fM, MLP %.2fM) | N_n %.2fM (token-indexed tables) | eta %.3f | rho %.3f\n",
              fr.n_total / 1e6, fr.n_c / 1e6, fr.n_c_attention / 1e6, fr.n_c_mlp / 1e6, fr.n_n / 1e6, fr.eta, fr.rho);
  std::printf("flops/token: 6N_c %.3g | exact %.3g (lm_head %.3g, attention %.3g, JTok %.3g) | tokens/step %lld\n",
              fr.flops_6nc, fr.flops_per_token, fr.flops_lm_head, fr.flops_attention, fr.flops_token_indexed,
              static_cast<long long>(t.tokens_per_step()));
  if (t.train_only == "tables")
    std::printf("train-only tables: the backbone is frozen (no weight gradients, no AdamW moments); tables, scalers "
                "and routers train at lr %g\n", t.table_learning_rate >= 0 ? t.table_learning_rate : t.learning_rate);
}

// The loader's options: random batches of the config's seed, ids checked against the tokenizer.
jtok::LoaderOptions loader_options(const jtok::Config& cfg, const jtok::Tokenizer& tok) {
  jtok::LoaderOptions lo;
  lo.mode = "random";
  lo.seed = cfg.train.seed;
  lo.vocab_size = static_cast<uint32_t>(cfg.model.vocab_size);
  lo.tokenizer = tok.name();
  lo.tokenizer_fingerprint = tok.fingerprint();
  return lo;
}

// Training batches from the loader (with peek for --tables disk's read-ahead, and its resumable state).
jtok::BatchSource batch_source(jtok::DataLoader& loader) {
  using namespace jtok;
  BatchSource src;
  src.next = [&loader](int32_t* x, int32_t* y, int64_t B, int64_t T) {
    Batch b = loader.next_batch(static_cast<int>(B), static_cast<int>(T));
    std::copy(b.inputs.begin(), b.inputs.end(), x);
    std::copy(b.targets.begin(), b.targets.end(), y);
  };
  src.peek = [&loader](int64_t n, int32_t* x, int64_t B, int64_t T) {
    const std::vector<int32_t> ids = loader.peek_inputs(static_cast<int>(n), static_cast<int>(B), static_cast<int>(T));
    std::copy(ids.begin(), ids.end(), x);
  };
  src.state = [&loader] { return to_json(loader.state()); };
  src.restore = [&loader](const nlohmann::json& j) { loader.restore(loader_state_from_json(j)); };
  return src;
}

// The validation batches in order from the first, from reset() on; val_i is the next one's index.
jtok::ValSource val_source(const jtok::ValidationSet& valset, size_t& val_i) {
  jtok::ValSource val;
  val.batches = static_cast<int64_t>(valset.num_batches());
  val.reset = [&val_i] { val_i = 0; };
  val.next = [&valset, &val_i](int32_t* x, int32_t* y, int64_t, int64_t) {
    jtok::Batch b = valset.batch(val_i++ % valset.num_batches());
    std::copy(b.inputs.begin(), b.inputs.end(), x);
    std::copy(b.targets.begin(), b.targets.end(), y);
  };
  return val;
}

// --device cuda: the GPU (or an error naming the driver / runtime seen) and its bf16 tensor-core peak,
// the MFU denominator (--peak-gflops overrides it).
void set_gpu_peak(jtok::TrainOptions& opt, const std::string& precision) {
  const jtok::cuda::DeviceInfo d = jtok::cuda::require_cuda_device();
  std::printf("device: %s\n", jtok::cuda::describe(d).c_str());
  std::printf("precision: %s on the GPU (%s)\n", precision.c_str(),
              precision == "bf16" ? "bf16 copies of the fp32 master weights, fp32 accumulation" : "fp32 throughout");
  opt.peak_gflops = args.peak_gflops >= 0 ? args.peak_gflops : d.bf16_peak_tflops * 1e3;
  opt.extra_report["gpu"] = jtok::cuda::describe(d);
}

// The trainer's options from the command line, the precision set up (and printed) and the peak measured.
jtok::TrainOptions train_options(const jtok::Config& cfg, const jtok::FlopsReport& fr, const std::string& init_from) {
  using namespace jtok;
  TrainOptions opt;
  opt.out_dir = args.out;
  opt.resume = args.resume;
  opt.embp = args.embp;
  opt.embp_owner = args.embp_owner;
  opt.dist_timeout_s = args.dist_timeout;
  opt.grad_overlap = args.grad_overlap == "on";
  opt.embp_overlap = args.embp_overlap == "on";
  opt.overwrite = args.overwrite;
  opt.tables = args.tables;
  opt.table_store = args.table_store;
  opt.table_cache_mb = args.table_cache_mb;
  opt.table_io_threads = args.table_io_threads;
  opt.table_io = table_io_option(args.table_io, args.table_direct_io, args.tables);
  opt.init_from = init_from;
  opt.no_checkpoints = args.no_checkpoints;
  opt.validate = args.validate;
  opt.skip_nonfinite_steps = args.skip_nonfinite_steps;
  opt.command_line = command_line_string();
  opt.device = args.device;
  opt.extra_report = {{"flops", to_json(fr)}, {"memory_plan", to_json(train_memory_plan(cfg))}, {"device", args.device}};
  if (!init_from.empty()) opt.extra_report["init_from"] = init_from;
  opt.flops_per_token = fr.flops_per_token_full_square;  // what the kernels compute
  if (args.device == "cuda") {
    set_gpu_peak(opt, cfg.train.precision);
    return opt;
  }
  const PrecisionReport precision = apply_training_precision(cfg.train.precision);
  if (!precision.line.empty()) std::printf("%s\n", precision.line.c_str());
  opt.extra_report["precision"] = precision.to_json();
  opt.peak_gflops = args.peak_gflops >= 0 ? args.peak_gflops : measure_peak_gflops(0.2);
  std::printf("machine: fp32 peak %.0f GFLOP/s (%s, measured; --peak-gflops to set)\n", opt.peak_gflops, simd_isa());
  return opt;
}


void run() {
  using namespace jtok;
  if (args.device == "cuda") jtok::cuda::require_cuda_device();  // before anything is read
  if (dist::world_size() > 1) std::printf("ranks: %d (data parallel, dist/data_parallel.h)\n", dist::world_size());
  std::vector<std::string> overrides;
  const std::string init_from = resolve_init_from();
  Config cfg = load_train_config(overrides, init_from);
  prepare_init_from(cfg, overrides, init_from);
  const auto& t = cfg.train;
  const FlopsReport fr = flops_report(cfg.model, t.seq_len);
  print_run_header(cfg, fr);
  check_memory_plan(cfg);

  Tokenizer tok = Tokenizer::load(t.tokenizer, t.tokenizer_dir);
  if (tok.vocab_size() > static_cast<uint32_t>(cfg.model.vocab_size))
    fail("tokenizer ", t.tokenizer, " has ", tok.vocab_size(), " ids but vocab_size is ", cfg.model.vocab_size);
  const LoaderOptions lo = loader_options(cfg, tok);
  DataLoader loader(list_shards(t.train_data), lo);
  ValidationSet valset(list_shards(t.val_data), lo, static_cast<int>(t.micro_batch_size), static_cast<int>(t.seq_len));
  if (valset.num_batches() == 0) fail("validation data ", t.val_data, " is shorter than one batch of ", t.micro_batch_size, " x ", t.seq_len);
  std::printf("data: train %s (%.2fM tokens), val %s (%zu batches)\n", t.train_data.c_str(),
              loader.shards().total_tokens() / 1e6, t.val_data.c_str(), valset.num_batches());
  // On a device the next micro-batch is read on a worker thread while the step computes; on the CPU
  // the step has every core.
  BatchSource src = args.device == "cpu" ? batch_source(loader) : prefetching(batch_source(loader));
  size_t val_i = 0;
  ValSource val = val_source(valset, val_i);

  TrainOptions opt = train_options(cfg, fr, init_from);
  const std::vector<int32_t> prompt = tok.encode_with_bos(args.sample_prompt);
  opt.sample = [&](const auto& generate) { return args.sample_prompt + tok.decode(generate(prompt, 32)); };
  install_stop_handler();
  TrainResult r = train(cfg, opt, src, &val);
  std::printf("done: %lld steps, loss %.4f%s\n", static_cast<long long>(r.steps_done), r.last_loss,
              r.interrupted ? " (interrupted; --resume continues)" : "");
  if (args.device == "cuda") {  // what the plan checked against the device, beside what it held
    const MemoryPlan plan = device_memory_plan(cfg, t.micro_batch_size, t.seq_len);
    std::printf("GPU memory: peak %.3f GiB held (the plan: %.3f GiB)\n",
                static_cast<double>(cuda::device_bytes_peak()) / (1 << 30), static_cast<double>(plan.total()) / (1 << 30));
  }
}

void add_table_options(CLI::App* sub);
void add_dist_options(CLI::App* sub);

void setup(CLI::App* sub) {
  self = sub;
  sub->add_option("--config", args.config,
                  "config JSON (model and training fields); required unless --init-from, whose checkpoint's "
                  "config.json is then the default");
  sub->add_option("--out", args.out, "run directory: log.jsonl, checkpoints/")->required();
  sub->add_option("--max-steps", args.max_steps, "optimizer steps (overrides max_steps)");
  sub->add_flag("--resume", args.resume, "continue from the newest complete checkpoint in --out");
  sub->add_flag("--overwrite", args.overwrite,
                "start afresh in an --out that holds another run: delete its checkpoints and log first");
  CLI::Option* no_ckpt = sub->add_flag("--no-checkpoints", args.no_checkpoints,
                                       "write no checkpoint and run no validation (benches: bench/embp_throughput.sh)");
  sub->add_flag("--validate", args.validate,
                "with --no-checkpoints: validate anyway, every eval_interval steps and after the last (a study's "
                "held-out losses: bench/gpu_study.sh; eval_batches 0 reads the whole validation set)")
      ->needs(no_ckpt);
  sub->add_option("--skip-nonfinite-steps", args.skip_nonfinite_steps,
                  "drop up to N batches whose loss or gradient norm is not finite (default 0: stop at the first)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--init-from", args.init_from,
                  "a new run from this checkpoint's weights (a checkpoint or run directory: its newest complete one); "
                  "without --config its config.json is the run's, flags overriding fields; --jtok / --jtokm attach "
                  "tables with s = 0 (docs/jtok.md \"Attaching tables\")");
  sub->add_option("--train-only", args.train_only, "what trains: all (default) or tables (the backbone frozen; sets train_only)")
      ->check(CLI::IsMember({"all", "tables"}));
  sub->add_option("--table-lr", args.table_lr, "peak learning rate of the tables, scalers and routers (sets table_learning_rate)");
  sub->add_flag("--no-memory-check", args.no_memory_check, "start even if the memory plan exceeds MemAvailable");
  sub->add_option("--set", args.sets, "override a config field: name=value (repeatable)");
  sub->add_option("--peak-gflops", args.peak_gflops,
                  "peak for MFU, GFLOP/s (default: the CPU's fp32 peak measured at start; --device cuda: the GPU's bf16 "
                  "tensor-core peak)");
  sub->add_option("--sample-prompt", args.sample_prompt, "prompt of the periodic samples");
  add_table_options(sub);
  add_dist_options(sub);
  fields = &jtok::add_config_field_options(sub);
  sub->add_option("--device", args.device,
                  "where the model trains: cpu (default) or cuda (an NVIDIA GPU; docs/cuda.md); loopback (tests): "
                  "the GPU trainer's path with the CPU engine as its device")
      ->check(CLI::IsMember({"cpu", "cuda", "loopback"}));
  sub->callback(run);
}

// Where the token tables live: --tables and the disk store's options.
void add_table_options(CLI::App* sub) {
  sub->add_option("--tables", args.tables,
                  "token tables: ram, or disk (rows and their AdamW moments in a training table store, --table-store; "
                  "hot rows in a DRAM cache of --table-cache-mb)")
      ->check(CLI::IsMember({"ram", "disk"}));
  sub->add_option("--table-store", args.table_store,
                  "--tables disk: the store directory (made from the initial tables; --resume reopens it)");
  sub->add_option("--table-cache-mb", args.table_cache_mb, "--tables disk: DRAM cache of token rows, MB (default 256)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--table-io-threads", args.table_io_threads,
                  "--tables disk: I/O threads reading the next step's rows ahead while a step computes (default 4; 0: no "
                  "read-ahead)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--table-io", args.table_io,
                  "--tables disk: how the store is read: auto (default: O_DIRECT, past the page cache, where the file "
                  "system takes it, else pread), direct or pread (through the page cache)");
  sub->add_flag("--table-direct-io", args.table_direct_io, "--tables disk: the same as --table-io direct");
}

// Under mpirun: embedding parallelism, overlaps and the watchdog.
void add_dist_options(CLI::App* sub) {
  sub->add_option("--embp", args.embp, "token-indexed tables under mpirun: off (replicated), or sharded by id: premix (the owner mixes each "
                  "position), naive (unique (id, table) rows fetched), premix-dedup (per id the cheaper of the two; docs/distributed.md)")
      ->check(CLI::IsMember({"off", "premix", "naive", "premix-dedup"}));
  sub->add_option("--embp-owner", args.embp_owner, "row ownership with --embp: mod (id mod P) or contiguous")
      ->check(CLI::IsMember({"mod", "contiguous"}));
  sub->add_option("--grad-overlap", args.grad_overlap,
                  "under mpirun: on (default): backbone gradients summed per layer while the backward runs; off: one "
                  "blocking sum after it (the same bits; docs/distributed.md)")
      ->check(CLI::IsMember({"on", "off"}));
  sub->add_option("--embp-overlap", args.embp_overlap,
                  "with --embp: on (default): JTok-M's exchanges posted after each layer's router and completed at its "
                  "write-back, table gradients pushed without waiting; off: blocking exchanges (the same bits; docs/distributed.md)")
      ->check(CLI::IsMember({"on", "off"}));
  sub->add_option("--dist-timeout", args.dist_timeout, "under mpirun: seconds a rank may wait in one MPI call before the job ends naming the ranks that stopped (0 = never)");
}

const bool registered = jtok::register_command({"train", "train a model on token shards", setup});

}  // namespace cmd_train
