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
  make_or_resume_model(r);  // tables placed; fresh, --init-from, or the newest checkpoint (weights, loader, RNG)
  open_run_log(r);          // log.jsonl; a fresh run's "start" line
  prepare_step_buffers(r);  // batch buffers, activations, gradient buckets; the placement's report
  for (int64_t step = r.start_step; step < r.train_cfg.max_steps; ++step) {
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
    if (!opt.no_checkpoints && (done % r.train_cfg.checkpoint_interval == 0 || done == r.train_cfg.max_steps || stop)) {
      save_checkpoint_at(r, done);
      kill_after_checkpoint(r.faults, done);  // a test's kill -9 at a known step
    }
    if (stop) {
      std::printf("stopped by signal after step %lld; resume with --resume\n", static_cast<long long>(done));
      r.result.interrupted = true;
      break;
    }
  }
  finish_run(r);  // peak memory per rank, the "end" line
  return r.result;
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

// Model, optimizer state, loader position and sample RNG from checkpoint r.resumed_from, after
// checking that it is this run's model.
void resume_from_checkpoint(TrainRun& r) {
  const std::string& ck = *r.resumed_from;
  Config saved = load_checkpoint_config(ck);
  if (to_json(saved.model) != to_json(r.cfg.model)) fail("--resume: the model config differs from checkpoint ", ck, "/config.json");
  if (saved.train.train_only != r.train_cfg.train_only)  // a frozen backbone stays frozen (its moments do not exist)
    fail("--resume: field train_only is '", saved.train.train_only, "' in checkpoint ", ck, "/config.json but '",
         r.train_cfg.train_only, "' now: resume with --train-only ", saved.train.train_only);
  r.tables->check_resumable(ck);
  const TrainerState st =
      parse_trainer_state(load_checkpoint(ck, r.model, &r.adam, r.tables->model_loads_tables()), ck + "/trainer_state.json");
  r.start_step = st.step;
  r.tables->resume(ck, st.step);
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
    : cfg(c), train_cfg(c.train), opt(o), data(d), val(v), lead(dist::rank() == 0),
      share(dist::batch_share(c.train.micro_batch_size, c.train.gradient_accumulation_steps, dist::rank(), dist::world_size())),
      faults(fault_injection_from_env()) {}

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

// The tables placed (train/table_placement.h), then the model made: a resumed one takes every value
// from its checkpoint (no random init to overwrite), a fresh one its init or --init-from's weights.
void make_or_resume_model(TrainRun& r) {
  const TrainConfig& t = r.train_cfg;
  if (r.opt.resume) {
    r.resumed_from = latest_checkpoint(r.opt.out_dir);
    if (!r.resumed_from) std::printf("resume: no complete checkpoint in %s, starting from scratch\n", r.opt.out_dir.c_str());
  }
  r.tables = choose_table_placement({r.cfg, r.opt, r.share, r.lead, r.model, r.adam, r.faults});
  const bool resuming = r.resumed_from.has_value(), init_from = !r.opt.init_from.empty();
  const bool tables_in_model = r.tables->model_allocates_tables(resuming, init_from);
  r.model = make_model(r.cfg.model, t.seed, {.init = !resuming, .grads = true, .tables = tables_in_model});
  r.model.backbone_frozen = t.train_only == "tables";  // before any optimizer state: frozen tensors get no moments
  r.sample_rng = std::mt19937_64(t.seed ^ 0x5eedULL);
  r.run_id = new_run_id();
  if (resuming) {
    resume_from_checkpoint(r);
    return;
  }
  if (init_from) {  // tensors the checkpoint lacks (attached modules) keep their fresh init
    const std::vector<std::string> fresh = load_init_weights(r.model, r.opt.init_from, tables_in_model);
    std::printf("init-from: %s loaded, %zu tensors kept fresh\n", r.opt.init_from.c_str(), fresh.size());
  }
  if (r.opt.init_weights) r.opt.init_weights(r.model);
  r.tables->start_fresh();
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

void prepare_step_buffers(TrainRun& r) {
  r.tty = ::isatty(STDOUT_FILENO);
  const int64_t N = r.train_cfg.micro_batch_size * r.train_cfg.seq_len;
  r.inputs.resize(N);
  r.targets.resize(N);
  r.acts.row_sync = table_row_sync(r.model, r.adam);  // table rows behind deferred steps catch up as read
  r.tables->attach(r.acts, r.log, r.start_step);
  if (r.share.ranks > 1 && r.opt.grad_overlap) r.buckets = std::make_unique<dist::GradBuckets>(r.model);
  for (int64_t mb = 0; mb < r.train_cfg.gradient_accumulation_steps; ++mb)
    if (r.share.runs(mb)) r.last_micro_batch = mb;
  r.no_routing.emplace(r.model);
}

// A signal may reach the ranks after different steps: stop when any rank has it.
bool stop_requested_on_any_rank() {
  double stop_any = g_stop.load() ? 1.0 : 0.0;
  dist::allreduce_max(&stop_any, 1);
  return stop_any > 0;
}

void finish_run(TrainRun& r) {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  if (r.share.ranks > 1) {  // each rank's peak resident memory
    std::vector<int64_t> rss(static_cast<size_t>(r.share.ranks), 0);
    rss[static_cast<size_t>(r.share.rank)] = ru.ru_maxrss;
    dist::allreduce_sum(rss.data(), r.share.ranks);
    r.log.write({{"type", "dist"}, {"step", r.result.steps_done}, {"ranks", r.share.ranks}, {"peak_rss_kb", rss}});
    std::printf("peak RSS per rank (kB): %s\n", nlohmann::json(rss).dump().c_str());
  }
  r.log.write({{"type", "end"}, {"step", r.result.steps_done}, {"loss", r.result.last_loss}, {"interrupted", r.result.interrupted},
               {"peak_rss_kb", ru.ru_maxrss}});
}

}  // namespace jtok
