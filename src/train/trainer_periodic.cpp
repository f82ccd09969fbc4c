// The work after an applied step: its log line and progress line, and, at their intervals,
// validation, a sample and a checkpoint.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "infer/generate.h"
#include "train/checkpoint.h"
#include "train/schedule.h"
#include "train/trainer_run.h"
#include "train/trainer_state.h"

namespace jtok {

namespace {

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

// The step's line of log.jsonl (and, at the log interval, JTok-M's routing line).
void write_step_json(TrainRun& r, int64_t done, const StepSums& s, const StepStats& st, double dt, double tps, double mfu) {
  const ModelConfig& mc = r.model.cfg;
  nlohmann::json line = {{"type", "step"}, {"step", done}, {"loss", s.loss}, {"grad_norm", st.grad_norm},
                         {"lr", st.lr}, {"ms", dt * 1e3}, {"tokens_per_s", tps}, {"tokens", done * r.t.tokens_per_step()}};
  if (mfu > 0) line["mfu"] = mfu;
  if (!s.dist_bytes.is_null()) line["dist_bytes"] = s.dist_bytes;
  if (mc.is_moe() || mc.jtokm) line["routing_digest"] = s.digest;
  if (mc.is_moe()) line["aux_loss"] = s.aux;
  if (mc.jtokm) line["jtokm_aux_loss"] = s.jaux;
  line["hidden_std"] = s.hstd;
  if (r.store) {  // this step's (and its validation's) table traffic: rows, units, read-ahead
    const TrainTableStore::Stats now = r.store->stats(), &was = r.store_seen;
    nlohmann::json ts;
    TrainTableStore::Stats& d = r.store_step;
    auto put = [&](const char* name, int64_t TrainTableStore::Stats::*f) { ts[name] = d.*f = now.*f - was.*f; };
    put("rows_read", &TrainTableStore::Stats::rows_read);
    put("rows_written", &TrainTableStore::Stats::rows_written);
    put("hits", &TrainTableStore::Stats::hits);
    put("waits", &TrainTableStore::Stats::waits);
    put("misses", &TrainTableStore::Stats::misses);
    put("units_read", &TrainTableStore::Stats::units_read);
    put("read_ahead", &TrainTableStore::Stats::read_ahead);
    put("prefetch_skipped", &TrainTableStore::Stats::prefetch_skipped);
    put("units_written", &TrainTableStore::Stats::units_written);
    put("units_logged", &TrainTableStore::Stats::units_logged);
    put("bytes_read", &TrainTableStore::Stats::bytes_read);
    put("bytes_written", &TrainTableStore::Stats::bytes_written);
    line["table_store"] = ts;
    r.store_seen = now;
  }
  r.log.write(line);
  if (mc.jtokm && (done % r.t.log_interval == 0 || done == r.t.max_steps)) r.log.write(s.routing.to_json(done));
}

// `step 120/5000 | loss 3.21 | norm 0.81 | lr 6.0e-04 | 412 ms | 31,234 tok/s | ... | ETA 2m03s`:
// a live bar on one line when stdout is a terminal, else one line each.
void print_progress(const TrainRun& r, int64_t done, const StepSums& s, const StepStats& st, double dt, double tps,
                    double mfu, double avg) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | norm %.3f | lr %.2e | %.0f ms | %s tok/s", static_cast<long long>(done),
                static_cast<long long>(r.t.max_steps), s.loss, st.grad_norm, st.lr, dt * 1e3, with_commas(tps).c_str());
  std::string line = buf;
  if (r.model.cfg.is_moe()) {
    std::snprintf(buf, sizeof buf, " | aux %.4f", s.aux);
    line += buf;
  }
  if (r.model.cfg.jtokm) {
    std::snprintf(buf, sizeof buf, " | jtokm aux %.2e | load max %.2f", s.jaux, s.routing.max_load_fraction());
    line += buf;
  }
  if (r.store) {  // --tables disk: the step's units read (how many ahead of need) and written back
    const TrainTableStore::Stats& d = r.store_step;
    std::snprintf(buf, sizeof buf, " | store %lld read (%lld ahead), %lld written", static_cast<long long>(d.units_read),
                  static_cast<long long>(d.read_ahead), static_cast<long long>(d.units_written));
    line += buf;
  }
  if (mfu > 0) {
    std::snprintf(buf, sizeof buf, " | MFU %.1f%%", 100 * mfu);
    line += buf;
  }
  line += " | ETA " + human_duration(avg * static_cast<double>(r.t.max_steps - done));
  if (r.tty) {
    const int width = 20;
    int filled = static_cast<int>(width * done / r.t.max_steps);
    std::printf("\r\033[K[%s%s] %s", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), line.c_str());
    if (done == r.t.max_steps) std::printf("\n");
  } else {
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
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

void log_step(TrainRun& r, int64_t done, const StepSums& s, const StepStats& st, double dt) {
  if (done - 1 > r.start_step) {  // the first step pays one-time allocation; keep it out of the ETA
    r.elapsed_train += dt;
    ++r.timed_steps;
  }
  const double tps = static_cast<double>(r.t.tokens_per_step()) / dt;
  const double avg = r.timed_steps ? r.elapsed_train / r.timed_steps : dt;
  const double mfu = r.opt.peak_gflops > 0 ? tps * r.opt.flops_per_token / 1e9 / r.opt.peak_gflops : 0.0;
  r.res.steps_done = done;
  r.res.last_loss = s.loss;
  write_step_json(r, done, s, st, dt, tps, mfu);
  if (done % r.t.log_interval == 0 || done == r.t.max_steps || done == r.start_step + 1)
    print_progress(r, done, s, st, dt, tps, mfu, avg);
}

void maybe_validate(TrainRun& r, int64_t done) {
  if (!r.val || r.opt.no_checkpoints || (done % r.t.eval_interval != 0 && done != r.t.max_steps)) return;
  if (!r.store) sync_tables(r.model, r.adam);  // evaluation reads any row (disk tables: synced as read)
  double vl = r.lead || r.embp ? mean_val_loss(r.model, r.acts, *r.val, r.t) : 0.0;  // sharded: every rank serves rows
  if (r.embp) r.embp->take_bytes();  // not a training step's exchange
  r.res.last_val_loss = vl;
  r.log.write({{"type", "val"}, {"step", done}, {"val_loss", vl}, {"val_ppl", std::exp(vl)}});
  std::printf("%sval step %lld | val_loss %.4f | ppl %.2f\n", r.tty ? "\n" : "", static_cast<long long>(done), vl, std::exp(vl));
}

void maybe_sample(TrainRun& r, int64_t done) {
  if (!r.lead || r.embp || r.store || !r.opt.sample || r.t.sample_interval <= 0 || done % r.t.sample_interval != 0) return;
  sync_tables(r.model, r.adam);  // generation reads any row
  auto gen = [&r](const std::vector<int32_t>& prompt, int64_t n) {
    KVCache cache;
    std::vector<int32_t> out;
    auto logits = prefill(r.model, cache, prompt, std::min<int64_t>(r.cfg.model.max_position_embeddings,
                                                                     static_cast<int64_t>(prompt.size()) + n));
    for (int64_t i = 0; i < n && cache.len < cache.capacity; ++i) {
      int32_t tok = sample_token(logits, {0.8, 40, 0.95}, r.sample_rng);
      out.push_back(tok);
      if (cache.len < cache.capacity) logits = decode_step(r.model, cache, tok);
    }
    return out;
  };
  std::string text = r.opt.sample(gen);
  r.log.write({{"type", "sample"}, {"step", done}, {"text", text}});
  std::printf("%ssample step %lld: %s\n", r.tty ? "\n" : "", static_cast<long long>(done), text.c_str());
}

void save_checkpoint_at(TrainRun& r, int64_t step) {
  const TrainConfig& t = r.t;
  const nlohmann::json st = to_json(TrainerState{.step = step, .run_id = r.run_id, .data = r.data.state(), .sample_rng = r.sample_rng,
                                                 .lr = lr_at(t, std::max<int64_t>(0, step - 1)), .max_steps = t.max_steps});
  // Disk tables: the store flushed (not synced: the checkpoint keeps the steps rows owe), except at
  // the run's end, where every row is brought current so the store holds the trained tables.
  if (!r.store || step == t.max_steps) sync_tables(r.model, r.adam);
  if (r.store) r.store->flush(step);
  std::string dir;
  if (r.store) {
    dir = save_checkpoint(r.opt.out_dir, step, r.cfg, r.model, r.adam, st, t.keep_checkpoints);
    r.store->seal(step);  // after the checkpoint is complete: the undo log starts over from it
  } else if (r.embp && !r.faults.gather_checkpoints) {  // every rank writes its own rows in place
    dir = save_checkpoint_sharded(r.opt.out_dir, step, r.cfg, r.model, r.adam, st, t.keep_checkpoints, r.embp_opt->owned_rows());
    if (!r.lead) return;
  } else {
    if (r.embp) r.embp_opt->gather_to_root(r.model, r.adam);  // rank 0 holds the whole tables while it writes
    if (!r.lead) return;
    dir = save_checkpoint(r.opt.out_dir, step, r.cfg, r.model, r.adam, st, t.keep_checkpoints);
    if (r.embp) r.embp_opt->release(r.model, r.adam);
  }
  r.log.write({{"type", "checkpoint"}, {"step", step}, {"path", dir}});
  std::printf("checkpoint: %s\n", dir.c_str());
}

}  // namespace jtok
