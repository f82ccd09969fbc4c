#include "train/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_int.h"
#include "dist/communicator.h"
#include "train/checkpoint.h"
#include "train/init_from.h"
#include "train/trainer_run.h"
#include "train/trainer_state.h"

namespace fs = std::filesystem;

namespace jtok {

// The run, top-down: set-up, then each step (forward and backward over the micro-batches, the
// non-finite policy, the optimizer) and its periodic work, then shutdown.
TrainResult train(const Config& cfg, const TrainOptions& opt, BatchSource& data, ValSource* val) {
  TrainRun r(cfg, opt, data, val);
  claim_run_directory(r);   // rank 0 locks and claims out_dir; every rank starts its watchdog
  make_or_resume_model(r);  // fresh, --init-from, or the newest checkpoint (weights, loader, RNG)
  open_run_log(r);          // log.jsonl; a fresh run's "start" line
  shard_tables(r);          // --embp: from here on this rank holds only its rows of the tables
  prepare_step_buffers(r);  // batch buffers, activations, gradient buckets
  for (int64_t step = r.start_step; step < r.t.max_steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const StepSums s = forward_backward(r, step);  // every micro-batch, summed over the ranks
    StepStats st;
    if (!apply_or_skip(r, step, s, st)) {  // not applied: the same step again, on the next batch
      --step;
      continue;
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t done = step + 1;
    log_step(r, done, s, st, dt);  // log.jsonl and the progress line
    maybe_validate(r, done);
    maybe_sample(r, done);
    const bool stop = stop_requested_on_any_rank();
    if (!opt.no_checkpoints && (done % r.t.checkpoint_interval == 0 || done == r.t.max_steps || stop))
      save_checkpoint_at(r, done);
    if (stop) {
      std::printf("stopped by signal after step %lld; resume with --resume\n", static_cast<long long>(done));
      r.res.interrupted = true;
      break;
    }
  }
  finish_run(r);  // peak memory per rank, the "end" line
  return r.res;
}

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

// On resume: keep only the log lines up to the resumed step (a killed run may have logged
// steps past its last checkpoint; they will be redone).
void truncate_log(const std::string& path, int64_t step) {
  if (!fs::exists(path)) return;
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      auto j = nlohmann::json::parse(line);
      if (j.contains("step") && json_int64(j["step"]).value_or(-1) > step) continue;
    } catch (const nlohmann::json::exception&) {
      continue;  // a line cut by the kill
    }
    kept += line + "\n";
  }
  write_file_atomic(path, kept);
}

// Model, optimizer state, loader position and sample RNG from checkpoint r.ck, after checking
// that it is this run's model.
void resume_from_checkpoint(TrainRun& r) {
  const std::string& ck = *r.ck;
  Config saved = load_checkpoint_config(ck);
  if (to_json(saved.model) != to_json(r.cfg.model)) fail("--resume: the model config differs from checkpoint ", ck, "/config.json");
  if (saved.train.train_only != r.t.train_only)  // a frozen backbone stays frozen (its moments do not exist)
    fail("--resume: field train_only is '", saved.train.train_only, "' in checkpoint ", ck, "/config.json but '",
         r.t.train_only, "' now: resume with --train-only ", saved.train.train_only);
  const bool disk = r.opt.tables == "disk";
  if (disk != fs::exists(fs::path(ck) / "table_store.json"))
    fail("--resume: checkpoint ", ck, disk ? " holds its token tables (no table_store.json): resume with --tables ram"
                                           : " keeps its token tables in a table store (table_store.json): resume with --tables disk --table-store DIR");
  const TrainerState st =
      parse_trainer_state(load_checkpoint(ck, r.model, &r.adam, /*tables=*/!r.embp_on && !disk), ck + "/trainer_state.json");
  r.start_step = st.step;
  if (disk) {  // the store rolled back to this checkpoint, and the steps its rows may still owe
    r.store = attach_disk_tables(r.model, r.opt.table_store, r.opt.table_cache_mb << 20, st.step, false, r.opt.table_io_threads,
                                 r.opt.table_io);
    r.adam.tables = make_table_moments(r.model.tables, true, r.adam.step);
    const std::string where = ck + "/table_store.json";
    restore_kept_steps(r.adam.tables, nlohmann::json::parse(read_file(where), nullptr, false), where);
  }
  r.data.restore(st.data);
  r.sample_rng = st.sample_rng;
  if (!st.run_id.empty()) r.run_id = st.run_id;
  else std::printf("resume: %s predates run ids; its retention will leave the older checkpoints alone\n", ck.c_str());
  if (r.lead) truncate_log(r.log_path, r.start_step);
  std::printf("resume: from %s (step %lld)\n", ck.c_str(), static_cast<long long>(r.start_step));
}

}  // namespace

void install_stop_handler() {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
}

TrainRun::TrainRun(const Config& c, const TrainOptions& o, BatchSource& d, ValSource* v)
    : cfg(c), t(c.train), opt(o), data(d), val(v), lead(dist::rank() == 0),
      share(dist::batch_share(c.train, dist::rank(), dist::world_size())), faults(fault_injection_from_env()) {}

void claim_run_directory(TrainRun& r) {
  if (r.lead) {
    std::error_code ec;
    fs::create_directories(r.opt.out_dir, ec);
    if (ec) fail(r.opt.out_dir, ": cannot create the run directory: ", ec.message());
    r.lock.emplace(r.opt.out_dir);                                // one trainer per directory
    claim_run_dir(r.opt.out_dir, r.opt.resume, r.opt.overwrite);  // never mixes this run with an old one
  }
  // The other ranks look at the directory only after rank 0 has claimed it (--overwrite).
  dist::barrier();
  r.watchdog.emplace(r.opt.out_dir, r.opt.dist_timeout_s);
  r.log_path = (fs::path(r.opt.out_dir) / "log.jsonl").string();
}

// --tables disk: one process's store, for a model with tables; what to run instead otherwise.
static void check_disk_tables_options(const TrainRun& r) {
  if (r.opt.table_store.empty()) fail("--tables disk needs --table-store DIR (the training store: made by a fresh run, reopened by --resume)");
  if (!(r.cfg.model.jtok || r.cfg.model.jtokm)) fail("--tables disk: the model has no token tables (set jtok or jtokm)");
  if (r.embp_on)
    fail("--tables disk with --embp ", r.opt.embp, ": embedding parallelism shards the tables over the ranks' memory, while a ",
         "training store holds them on one process's disk, and the two do not combine yet. Tables larger than one machine's ",
         "memory: --embp with --tables ram over enough ranks that each rank's shard and its AdamW moments fit (`jtok embp-plan` ",
         "prints the bytes per rank); on one machine: drop --embp and mpirun and train with --tables disk");
  if (r.share.ranks > 1)
    fail("--tables disk runs on one process (", r.share.ranks, " ranks here): data-parallel ranks would all update the one ",
         "store; with mpirun, shard the tables in RAM with --embp (--tables ram), or train on one process with --tables disk");
}

// A resumed model takes every value from its checkpoint: no random init to overwrite. With
// embedding parallelism a fresh run allocates no table: each rank initialises its own rows
// (dist::ShardedTables, the same values as one process); a resumed one reads each rank's rows
// from the checkpoint (no rank loads a whole table).
void make_or_resume_model(TrainRun& r) {
  const TrainConfig& t = r.t;
  if (r.opt.resume) {
    r.ck = latest_checkpoint(r.opt.out_dir);
    if (!r.ck) std::printf("resume: no complete checkpoint in %s, starting from scratch\n", r.opt.out_dir.c_str());
  }
  r.embp_on = r.opt.embp != "off" && (r.cfg.model.jtok || r.cfg.model.jtokm);
  r.shard_init = r.embp_on && !r.ck;
  const bool disk = r.opt.tables == "disk";
  if (r.opt.tables != "ram" && !disk) fail("--tables must be ram or disk for training, got '", r.opt.tables, "'");
  if (disk) check_disk_tables_options(r);
  // Disk tables live in the store: made there from the random init (or --init-from's tables, in RAM first).
  const bool tables_in_ram = !r.embp_on && (!disk || (!r.ck && !r.opt.init_from.empty()));
  r.model = make_model(r.cfg.model, t.seed, {.init = !r.ck, .grads = true, .tables = tables_in_ram});
  r.model.backbone_frozen = t.train_only == "tables";  // before any optimizer state: frozen tensors get no moments
  r.sample_rng = std::mt19937_64(t.seed ^ 0x5eedULL);
  r.run_id = new_run_id();
  if (r.ck) {
    resume_from_checkpoint(r);
    return;
  }
  if (!r.opt.init_from.empty()) {  // tensors the checkpoint lacks (attached modules) keep their fresh init
    const std::vector<std::string> fresh = load_init_weights(r.model, r.opt.init_from, !r.embp_on);
    std::printf("init-from: %s loaded, %zu tensors kept fresh\n", r.opt.init_from.c_str(), fresh.size());
  }
  if (disk)
    r.store = attach_disk_tables(r.model, r.opt.table_store, r.opt.table_cache_mb << 20, std::nullopt, r.opt.resume,
                                 r.opt.table_io_threads, r.opt.table_io, tables_in_ram ? nullptr : &t.seed);
  r.adam = make_adamw_state(r.model, !r.shard_init);
  if (r.lead && fs::exists(r.log_path)) truncate_log(r.log_path, 0);  // --resume with nothing to resume: no step is kept
}

void open_run_log(TrainRun& r) {
  if (r.lead) r.log.out.open(r.log_path, std::ios::app);
  if (r.lead && !r.log.out) fail("cannot write ", r.log_path);
  if (r.start_step != 0) return;
  nlohmann::json start = {{"type", "start"}, {"command", r.opt.command_line}, {"config", to_json(r.cfg)},
                          {"params_total", num_params(r.model)}, {"run_id", r.run_id}};
  for (auto& [k, v] : r.opt.extra_report.items()) start[k] = v;
  r.log.write(start);
}

void shard_tables(TrainRun& r) {
  if (!r.embp_on) return;
  r.embp = std::make_unique<dist::ShardedTables>(r.model, dist::ShardedTables::parse_mode(r.opt.embp),
                                                 dist::ShardedTables::parse_owner(r.opt.embp_owner),
                                                 r.shard_init ? &r.t.seed : nullptr, r.ck ? &*r.ck : nullptr);
  r.embp_opt = std::make_unique<ShardOptimizer>(*r.embp, r.model, r.adam, r.ck ? &*r.ck : nullptr);
  r.embp->set_overlap(r.opt.embp_overlap);
}

// The embp report: each rank's table and moment bytes (a collective), logged and printed.
static void report_sharded_tables(TrainRun& r) {
  dist::ShardedTables& embp = *r.embp;
  std::vector<int64_t> tb, mb;
  gather_pairs(r.share, embp.table_bytes(), r.embp_opt->moment_bytes(), tb, mb);
  r.log.write({{"type", "embp"}, {"step", r.start_step}, {"mode", r.opt.embp}, {"owner", r.opt.embp_owner},
               {"table_bytes", tb}, {"moment_bytes", mb}, {"single_process_table_bytes", embp.single_process_table_bytes()}});
  std::printf("embp: %s, rows by %s over %lld ranks | table bytes per rank %s of %lld (+ AdamW moments x2)\n",
              r.opt.embp.c_str(), r.opt.embp_owner.c_str(), static_cast<long long>(r.share.ranks), nlohmann::json(tb).dump().c_str(),
              static_cast<long long>(embp.single_process_table_bytes()));
  if (r.t.sample_interval > 0) std::printf("embp: periodic samples are off (generation does not reach sharded tables yet)\n");
}

void prepare_step_buffers(TrainRun& r) {
  r.tty = ::isatty(STDOUT_FILENO);
  const int64_t N = r.t.micro_batch_size * r.t.seq_len;
  r.x.resize(N);
  r.y.resize(N);
  r.acts.row_sync = table_row_sync(r.model, r.adam);  // table rows behind deferred steps catch up as read
  if (r.embp) {
    r.acts.tables = r.embp.get();
    report_sharded_tables(r);
  }
  if (r.share.ranks > 1 && r.opt.grad_overlap) r.buckets = std::make_unique<dist::GradBuckets>(r.model);
  for (int64_t mb = 0; mb < r.t.gradient_accumulation_steps; ++mb)
    if (r.share.runs(mb)) r.last_mb = mb;
  r.no_routing.emplace(r.model);
}

// A signal may reach the ranks after different steps: stop when any rank has it.
bool stop_requested_on_any_rank() {
  double stop_any = g_stop.load() ? 1.0 : 0.0;
  dist::allreduce_max(&stop_any, 1);
  return stop_any > 0;
}

void gather_pairs(const dist::BatchShare& share, int64_t a, int64_t b, std::vector<int64_t>& as, std::vector<int64_t>& bs) {
  std::vector<int64_t> all(static_cast<size_t>(2 * share.ranks), 0);
  all[static_cast<size_t>(2 * share.rank)] = a;
  all[static_cast<size_t>(2 * share.rank + 1)] = b;
  dist::allreduce_sum(all.data(), static_cast<int64_t>(all.size()));
  for (int64_t k = 0; k < share.ranks; ++k) as.push_back(all[2 * k]), bs.push_back(all[2 * k + 1]);
}

void finish_run(TrainRun& r) {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  if (r.share.ranks > 1) {  // each rank's peak resident memory
    std::vector<int64_t> rss(static_cast<size_t>(r.share.ranks), 0);
    rss[static_cast<size_t>(r.share.rank)] = ru.ru_maxrss;
    dist::allreduce_sum(rss.data(), r.share.ranks);
    r.log.write({{"type", "dist"}, {"step", r.res.steps_done}, {"ranks", r.share.ranks}, {"peak_rss_kb", rss}});
    std::printf("peak RSS per rank (kB): %s\n", nlohmann::json(rss).dump().c_str());
  }
  r.log.write({{"type", "end"}, {"step", r.res.steps_done}, {"loss", r.res.last_loss}, {"interrupted", r.res.interrupted},
               {"peak_rss_kb", ru.ru_maxrss}});
}

}  // namespace jtok
