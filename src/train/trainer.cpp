#include "train/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_int.h"
#include "dist/communicator.h"
#include "dist/data_parallel.h"
#include "dist/sharded_tables.h"
#include "dist/watchdog.h"
#include "infer/generate.h"
#include "model/transformer.h"
#include "train/checkpoint.h"
#include "train/fault_injection.h"
#include "train/init_from.h"
#include "train/optimizer.h"
#include "train/shard_optimizer.h"
#include "train/run_dir.h"
#include "train/schedule.h"
#include "train/telemetry.h"
#include "train/trainer_state.h"

namespace fs = std::filesystem;

namespace jtok {

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

std::string human_duration(double s) {
  char buf[32];
  long t = static_cast<long>(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

std::string with_commas(double v) {
  const std::string digits = std::to_string(static_cast<long long>(v + 0.5));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// Appends one JSON object per line; flushed after each line so a kill loses at most the last.
struct JsonlLog {
  std::ofstream out;
  void write(const nlohmann::json& j) {
    out << j.dump() << '\n';
    out.flush();
  }
};

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

double mean_val_loss(const Model& m, Activations& acts, ValSource& val, const TrainConfig& t) {
  const int64_t B = t.micro_batch_size, T = t.seq_len;
  std::vector<int32_t> x(B * T), y(B * T);
  val.reset();
  double sum = 0;
  for (int64_t i = 0; i < t.eval_batches; ++i) {
    val.next(x.data(), y.data(), B, T);
    forward(m, acts, x.data(), B, T);
    sum += loss_of_logits(m, acts, y.data());
  }
  return sum / static_cast<double>(t.eval_batches);
}

}  // namespace

void install_stop_handler() {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
}

// Where a non-finite loss came from: the first dense weight or token-table row holding a NaN or an
// infinity ("" if none). Run only after a non-finite loss, so it costs nothing on the normal path.
static std::string first_nonfinite_weight(const Model& m) {
  for (const auto& p : m.layout)
    for (int64_t i = 0; i < p.numel; ++i)
      if (!std::isfinite(m.params[static_cast<size_t>(p.offset + i)])) return p.name;
  for (size_t k = 0; k < m.tables.size(); ++k) {
    const TokenTable& t = m.tables[k];
    if (!t.data()) continue;  // sharded away (embedding parallelism)
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t c = 0; c < t.dim; ++c)
        if (!std::isfinite(t.row(r)[c])) return "table " + m.table_names[k] + " row " + std::to_string(r);
  }
  return "";
}

TrainResult train(const Config& cfg, const TrainOptions& opt, BatchSource& data, ValSource* val) {
  const auto& t = cfg.train;
  // Under mpirun (dist/data_parallel.h): every rank trains its share of each step; rank 0 alone
  // owns the run directory (lock, log, checkpoints), validation and samples.
  const bool lead = dist::rank() == 0;
  const dist::BatchShare share = dist::batch_share(t, dist::rank(), dist::world_size());
  std::optional<RunDirLock> lock;
  if (lead) {
    std::error_code ec;
    fs::create_directories(opt.out_dir, ec);
    if (ec) fail(opt.out_dir, ": cannot create the run directory: ", ec.message());
    lock.emplace(opt.out_dir);                              // one trainer per directory
    claim_run_dir(opt.out_dir, opt.resume, opt.overwrite);  // never mixes this run with an old one
  }
  // The other ranks look at the directory only after rank 0 has claimed it (--overwrite).
  dist::barrier();
  dist::Watchdog watchdog(opt.out_dir, opt.dist_timeout_s);
  const std::string log_path = (fs::path(opt.out_dir) / "log.jsonl").string();
  std::optional<std::string> ck;
  if (opt.resume) {
    ck = latest_checkpoint(opt.out_dir);
    if (!ck) std::printf("resume: no complete checkpoint in %s, starting from scratch\n", opt.out_dir.c_str());
  }
  // A resumed model takes every value from its checkpoint: no random init to overwrite. With
  // embedding parallelism a fresh run allocates no table: each rank initialises its own rows
  // (dist::ShardedTables, the same values as one process).
  // A resumed one reads each rank's rows from the checkpoint (no rank loads a whole table).
  const bool embp_on = opt.embp != "off" && (cfg.model.jtok || cfg.model.jtokm);
  const bool shard_init = embp_on && !ck;
  Model model = make_model(cfg.model, t.seed, {.init = !ck, .grads = true, .tables = !embp_on});
  model.backbone_frozen = t.train_only == "tables";  // before any optimizer state: frozen tensors get no moments
  AdamWState adam;
  std::mt19937_64 sample_rng(t.seed ^ 0x5eedULL);
  int64_t start_step = 0;
  std::string run_id = new_run_id();

  if (ck) {
    Config saved = load_checkpoint_config(*ck);
    if (to_json(saved.model) != to_json(cfg.model))
      fail("--resume: the model config differs from checkpoint ", *ck, "/config.json");
    if (saved.train.train_only != t.train_only)  // a frozen backbone stays frozen (its moments do not exist)
      fail("--resume: field train_only is '", saved.train.train_only, "' in checkpoint ", *ck, "/config.json but '",
           t.train_only, "' now: resume with --train-only ", saved.train.train_only);
    const TrainerState st =
        parse_trainer_state(load_checkpoint(*ck, model, &adam, /*tables=*/!embp_on), *ck + "/trainer_state.json");
    start_step = st.step;
    data.restore(st.data);
    sample_rng = st.sample_rng;
    if (!st.run_id.empty()) run_id = st.run_id;
    else std::printf("resume: %s predates run ids; its retention will leave the older checkpoints alone\n", ck->c_str());
    if (lead) truncate_log(log_path, start_step);
    std::printf("resume: from %s (step %lld)\n", ck->c_str(), static_cast<long long>(start_step));
  } else {
    if (!opt.init_from.empty()) {  // tensors the checkpoint lacks (attached modules) keep their fresh init
      const std::vector<std::string> fresh = load_init_weights(model, opt.init_from, !embp_on);
      std::printf("init-from: %s loaded, %zu tensors kept fresh\n", opt.init_from.c_str(), fresh.size());
    }
    adam = make_adamw_state(model, !shard_init);
    if (lead && fs::exists(log_path)) truncate_log(log_path, 0);  // --resume with nothing to resume: no step is kept
  }
  // Stops the run at a step that must not be applied: logged, and nothing saved.
  auto fail_step = [&](int64_t step, const std::string& why) {
    const auto newest = latest_checkpoint(opt.out_dir);
    const std::string msg = "step " + std::to_string(step) + ": " + why + "; nothing was saved (newest checkpoint: " +
                            (newest ? *newest : std::string("none")) + ")";
    if (lead) std::ofstream(log_path, std::ios::app) << nlohmann::json{{"type", "error"}, {"step", step}, {"message", msg}}.dump() << "\n";
    fail(msg, "; lower learning_rate or check the data, then --resume");
  };
  FaultInjection faults = fault_injection_from_env();  // test-only hooks (train/fault_injection.h)
  int64_t skipped_steps = 0;
  JsonlLog log;  // other ranks: never opened, writes go nowhere
  if (lead) log.out.open(log_path, std::ios::app);
  if (lead && !log.out) fail("cannot write ", log_path);
  if (start_step == 0) {
    nlohmann::json start = {{"type", "start"}, {"command", opt.command_line}, {"config", to_json(cfg)},
                            {"params_total", num_params(model)}, {"run_id", run_id}};
    for (auto& [k, v] : opt.extra_report.items()) start[k] = v;
    log.write(start);
  }

  // Embedding parallelism: from here on this rank holds only its rows of the tables.
  std::unique_ptr<dist::ShardedTables> embp;
  std::unique_ptr<ShardOptimizer> embp_opt;  // the owned rows' moments and their table optimizer
  if (embp_on) {
    embp = std::make_unique<dist::ShardedTables>(model, dist::ShardedTables::parse_mode(opt.embp),
                                                 dist::ShardedTables::parse_owner(opt.embp_owner),
                                                 shard_init ? &t.seed : nullptr, ck ? &*ck : nullptr);
    embp_opt = std::make_unique<ShardOptimizer>(*embp, model, adam, ck ? &*ck : nullptr);
    embp->set_overlap(opt.embp_overlap);
  }
  auto save = [&](int64_t step) {
    const nlohmann::json st = to_json(TrainerState{.step = step, .run_id = run_id, .data = data.state(), .sample_rng = sample_rng,
                                                   .lr = lr_at(t, std::max<int64_t>(0, step - 1)), .max_steps = t.max_steps});
    sync_tables(model, adam);
    std::string dir;
    if (embp && !faults.gather_checkpoints) {  // every rank writes its own rows in place
      dir = save_checkpoint_sharded(opt.out_dir, step, cfg, model, adam, st, t.keep_checkpoints, embp_opt->owned_rows());
      if (!lead) return;
    } else {
      if (embp) embp_opt->gather_to_root(model, adam);  // rank 0 holds the whole tables while it writes
      if (!lead) return;
      dir = save_checkpoint(opt.out_dir, step, cfg, model, adam, st, t.keep_checkpoints);
      if (embp) embp_opt->release(model, adam);
    }
    log.write({{"type", "checkpoint"}, {"step", step}, {"path", dir}});
    std::printf("checkpoint: %s\n", dir.c_str());
  };

  const bool tty = ::isatty(STDOUT_FILENO);
  const int64_t B = t.micro_batch_size, T = t.seq_len, N = B * T;
  std::vector<int32_t> x(N), y(N);
  Activations acts;
  acts.row_sync = table_row_sync(model, adam);  // table rows behind deferred steps catch up as read
  if (embp) {
    acts.tables = embp.get();
    const int64_t mine[2] = {embp->table_bytes(), embp_opt->moment_bytes()};
    std::vector<int64_t> all(static_cast<size_t>(2 * share.ranks), 0);
    all[static_cast<size_t>(2 * share.rank)] = mine[0];
    all[static_cast<size_t>(2 * share.rank + 1)] = mine[1];
    dist::allreduce_sum(all.data(), static_cast<int64_t>(all.size()));
    std::vector<int64_t> tb, mb;
    for (int64_t r = 0; r < share.ranks; ++r) tb.push_back(all[2 * r]), mb.push_back(all[2 * r + 1]);
    log.write({{"type", "embp"}, {"step", start_step}, {"mode", opt.embp}, {"owner", opt.embp_owner},
               {"table_bytes", tb}, {"moment_bytes", mb}, {"single_process_table_bytes", embp->single_process_table_bytes()}});
    std::printf("embp: %s, rows by %s over %lld ranks | table bytes per rank %s of %lld (+ AdamW moments x2)\n",
                opt.embp.c_str(), opt.embp_owner.c_str(), static_cast<long long>(share.ranks), nlohmann::json(tb).dump().c_str(),
                static_cast<long long>(embp->single_process_table_bytes()));
    if (t.sample_interval > 0) std::printf("embp: periodic samples are off (generation does not reach sharded tables yet)\n");
  }
  // Backbone gradients summed in buckets during the backward of the last micro-batch this rank runs.
  std::unique_ptr<dist::GradBuckets> buckets;
  if (share.ranks > 1 && opt.grad_overlap) buckets = std::make_unique<dist::GradBuckets>(model);
  int64_t last_mb = -1;
  for (int64_t mb = 0; mb < t.gradient_accumulation_steps; ++mb)
    if (share.runs(mb)) last_mb = mb;
  TrainResult res;
  double elapsed_train = 0;
  int64_t timed_steps = 0;
  const RoutingStats no_routing(model);  // zero counts for the JTok-M layers, copied each step
  for (int64_t step = start_step; step < t.max_steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    zero_grads(model);
    if (embp) embp->clear_grads();
    watchdog.set_step(step + 1);
    // LM loss and the aux losses (MoE, JTok-M) apart; the gradient is of their sum.
    double loss = 0, aux = 0, jaux = 0, hstd = 0;
    RoutingStats routing = no_routing;
    const double inv_acc = 1.0 / static_cast<double>(t.gradient_accumulation_steps);
    int64_t digest = 0;  // of the step's routing choices (MoE, JTok-M), for comparing runs
    const double mb_weight = share.by_micro_batch ? inv_acc : inv_acc / static_cast<double>(share.ranks);
    for (int64_t mb = 0; mb < t.gradient_accumulation_steps; ++mb) {
      data.next(x.data(), y.data(), B, T);  // every rank reads every micro-batch: one loader state
      inject_nan_table_row(faults, model, step + 1, x[0], embp != nullptr);
      if (!share.runs(mb)) continue;
      // The last micro-batch this rank runs: its backward starts summing each layer's gradients.
      if (buckets && mb == last_mb)
        acts.on_layer_grads_ready = [&](int64_t layer) { buckets->layer_ready(model, layer); };
      else
        acts.on_layer_grads_ready = nullptr;
      const int32_t* xs = x.data() + share.row_lo * T;
      const int32_t* ys = y.data() + share.row_lo * T;
      forward(model, acts, xs, share.row_hi - share.row_lo, T);
      if (mb == share.rank * share.by_micro_batch) hstd = hidden_state_std(acts);
      routing.add(acts);
      digest = (digest + dist::routing_digest(acts, mb, share.row_lo)) & ((int64_t{1} << 56) - 1);
      loss += backward(model, acts, xs, ys, share.grad_scale) * mb_weight;
      aux += acts.moe_aux_loss * mb_weight;
      jaux += acts.jtokm_aux_loss * mb_weight;
    }
    nlohmann::json dist_bytes;
    if (share.ranks > 1) {  // sum gradients, losses and routing counts over the ranks
      acts.on_layer_grads_ready = nullptr;
      const dist::ExchangeBytes xb = dist::sum_gradients(model, !embp, buckets.get());
      std::vector<double> sums = {loss, aux, jaux};
      for (size_t k = 0; k < routing.load.size(); ++k) {
        sums.insert(sums.end(), routing.load[k].begin(), routing.load[k].end());
        sums.insert(sums.end(), routing.wsum[k].begin(), routing.wsum[k].end());
      }
      dist::allreduce_sum(sums.data(), static_cast<int64_t>(sums.size()));
      loss = sums[0], aux = sums[1], jaux = sums[2];
      for (size_t k = 0, o = 3; k < routing.load.size(); ++k) {
        for (auto& v : routing.load[k]) v = sums[o++];
        for (auto& v : routing.wsum[k]) v = sums[o++];
      }
      dist_bytes = dist::gather_bytes_json(xb);
      if (embp) {  // the table exchanges of this step's forwards and backwards, per rank
        const dist::TableBytes eb = embp->take_bytes();
        std::vector<int64_t> v(static_cast<size_t>(2 * share.ranks), 0);
        v[static_cast<size_t>(2 * share.rank)] = eb.sent;
        v[static_cast<size_t>(2 * share.rank + 1)] = eb.recv;
        dist::allreduce_sum(v.data(), static_cast<int64_t>(v.size()));
        std::vector<int64_t> sent, recv;
        for (int64_t r = 0; r < share.ranks; ++r) sent.push_back(v[2 * r]), recv.push_back(v[2 * r + 1]);
        dist_bytes["embp_sent"] = sent;
        dist_bytes["embp_recv"] = recv;
      }
      int64_t dg[2] = {digest, 0};
      dist::allreduce_sum(dg, 2);
      digest = dg[0] & ((int64_t{1} << 56) - 1);
    }
    inject_nan_grad(faults, model, step + 1);
    // A step whose loss or gradient is not finite is never applied: the run stops, or with
    // --skip-nonfinite-steps N the batch is dropped (up to N times) and the step retried on the next.
    std::string nonfinite;
    StepStats st;
    if (!std::isfinite(loss)) {
      const std::string where = first_nonfinite_weight(model);
      nonfinite = "the loss is " + std::to_string(loss) + "; the step was not applied (" +
                  (where.empty() ? "every weight and table row is finite: an activation overflowed" : "first non-finite weight: " + where) + ")";
    } else {
      try {
        // With sharded tables the norm takes every rank's shard gradients (a collective: every rank
        // has the same loss here), and the owners update their rows.
        st = optimizer_step(model, adam, t, embp ? embp->grad_sum_squares() : 0.0);  // refuses a non-finite norm first
        if (embp) embp_opt->step(t, st, adam.step);
      } catch (const Error& e) {
        nonfinite = e.what();
      }
    }
    if (!nonfinite.empty()) {
      if (skipped_steps >= opt.skip_nonfinite_steps) fail_step(step + 1, nonfinite);
      ++skipped_steps;
      log.write({{"type", "skipped_step"}, {"step", step + 1}, {"reason", nonfinite}, {"skipped_total", skipped_steps}});
      std::printf("%sstep %lld skipped (%lld of %lld allowed): %s\n", tty ? "\n" : "", static_cast<long long>(step + 1),
                  static_cast<long long>(skipped_steps), static_cast<long long>(opt.skip_nonfinite_steps), nonfinite.c_str());
      --step;  // the same step again, on the next batch
      continue;
    }
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step > start_step) {  // the first step pays one-time allocation; keep it out of the ETA
      elapsed_train += dt;
      ++timed_steps;
    }
    const int64_t done = step + 1;
    const double tps = static_cast<double>(t.tokens_per_step()) / dt;
    const double avg = timed_steps ? elapsed_train / timed_steps : dt;
    const double mfu = opt.peak_gflops > 0 ? tps * opt.flops_per_token / 1e9 / opt.peak_gflops : 0.0;
    res.steps_done = done;
    res.last_loss = loss;
    nlohmann::json line = {{"type", "step"}, {"step", done}, {"loss", loss}, {"grad_norm", st.grad_norm},
                           {"lr", st.lr}, {"ms", dt * 1e3}, {"tokens_per_s", tps}, {"tokens", done * t.tokens_per_step()}};
    if (mfu > 0) line["mfu"] = mfu;
    if (!dist_bytes.is_null()) line["dist_bytes"] = dist_bytes;
    if (model.cfg.is_moe() || model.cfg.jtokm) line["routing_digest"] = digest;
    if (model.cfg.is_moe()) line["aux_loss"] = aux;
    if (model.cfg.jtokm) line["jtokm_aux_loss"] = jaux;
    line["hidden_std"] = hstd;
    log.write(line);
    if (model.cfg.jtokm && (done % t.log_interval == 0 || done == t.max_steps)) log.write(routing.to_json(done));
    if (done % t.log_interval == 0 || done == t.max_steps || done == start_step + 1) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | norm %.3f | lr %.2e | %.0f ms | %s tok/s", static_cast<long long>(done),
                    static_cast<long long>(t.max_steps), loss, st.grad_norm, st.lr, dt * 1e3, with_commas(tps).c_str());
      std::string s = buf;
      if (model.cfg.is_moe()) {
        std::snprintf(buf, sizeof buf, " | aux %.4f", aux);
        s += buf;
      }
      if (model.cfg.jtokm) {
        std::snprintf(buf, sizeof buf, " | jtokm aux %.2e | load max %.2f", jaux, routing.max_load_fraction());
        s += buf;
      }
      if (mfu > 0) {
        std::snprintf(buf, sizeof buf, " | MFU %.1f%%", 100 * mfu);
        s += buf;
      }
      s += " | ETA " + human_duration(avg * static_cast<double>(t.max_steps - done));
      if (tty) {  // a live bar on the same line
        const int width = 20;
        int filled = static_cast<int>(width * done / t.max_steps);
        std::printf("\r\033[K[%s%s] %s", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), s.c_str());
        if (done == t.max_steps) std::printf("\n");
      } else {
        std::printf("%s\n", s.c_str());
      }
      std::fflush(stdout);
    }
    if (val && !opt.no_checkpoints && (done % t.eval_interval == 0 || done == t.max_steps)) {
      sync_tables(model, adam);  // evaluation reads any row
      double vl = lead || embp ? mean_val_loss(model, acts, *val, t) : 0.0;  // sharded: every rank serves rows
      if (embp) embp->take_bytes();  // not a training step's exchange
      res.last_val_loss = vl;
      log.write({{"type", "val"}, {"step", done}, {"val_loss", vl}, {"val_ppl", std::exp(vl)}});
      std::printf("%sval step %lld | val_loss %.4f | ppl %.2f\n", tty ? "\n" : "", static_cast<long long>(done), vl, std::exp(vl));
    }
    if (lead && !embp && opt.sample && t.sample_interval > 0 && done % t.sample_interval == 0) {
      sync_tables(model, adam);  // generation reads any row
      auto gen = [&](const std::vector<int32_t>& prompt, int64_t n) {
        KVCache cache;
        std::vector<int32_t> out;
        auto logits = prefill(model, cache, prompt, std::min<int64_t>(cfg.model.max_position_embeddings,
                                                                         static_cast<int64_t>(prompt.size()) + n));
        for (int64_t i = 0; i < n && cache.len < cache.capacity; ++i) {
          int32_t tok = sample_token(logits, {0.8, 40, 0.95}, sample_rng);
          out.push_back(tok);
          if (cache.len < cache.capacity) logits = decode_step(model, cache, tok);
        }
        return out;
      };
      std::string text = opt.sample(gen);
      log.write({{"type", "sample"}, {"step", done}, {"text", text}});
      std::printf("%ssample step %lld: %s\n", tty ? "\n" : "", static_cast<long long>(done), text.c_str());
    }
    // A signal may reach the ranks after different steps: stop when any rank has it.
    double stop_any = g_stop.load() ? 1.0 : 0.0;
    dist::allreduce_max(&stop_any, 1);
    const bool stop = stop_any > 0;
    if (!opt.no_checkpoints && (done % t.checkpoint_interval == 0 || done == t.max_steps || stop)) save(done);
    if (stop) {
      std::printf("stopped by signal after step %lld; resume with --resume\n", static_cast<long long>(done));
      res.interrupted = true;
      break;
    }
  }
  if (share.ranks > 1) {  // each rank's peak resident memory
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    std::vector<int64_t> rss(static_cast<size_t>(share.ranks), 0);
    rss[static_cast<size_t>(share.rank)] = ru.ru_maxrss;
    dist::allreduce_sum(rss.data(), share.ranks);
    log.write({{"type", "dist"}, {"step", res.steps_done}, {"ranks", share.ranks}, {"peak_rss_kb", rss}});
    std::printf("peak RSS per rank (kB): %s\n", nlohmann::json(rss).dump().c_str());
  }
  log.write({{"type", "end"}, {"step", res.steps_done}, {"loss", res.last_loss}, {"interrupted", res.interrupted}});
  return res;
}

}  // namespace jtok
