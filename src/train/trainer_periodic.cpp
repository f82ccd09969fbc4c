// The work after an applied step: its log line and progress line, and, at their intervals,
// validation, a sample and a checkpoint.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "cuda/training.h"
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
                         {"lr", st.lr}, {"ms", dt * 1e3}, {"tokens_per_s", tps}, {"tokens", done * r.train_cfg.tokens_per_step()}};
  if (mfu > 0) line["mfu"] = mfu;
  if (!s.dist_bytes.is_null()) line["dist_bytes"] = s.dist_bytes;
  if (mc.is_moe() || mc.jtokm) line["routing_digest"] = s.digest;
  if (mc.is_moe()) line["aux_loss"] = s.moe_aux;
  if (mc.jtokm) line["jtokm_aux_loss"] = s.jtokm_aux;
  line["hidden_std"] = s.hidden_std;
  r.tables->report_step(line);  // the tables' traffic, where they keep any (a store on disk)
  r.log.write(line);
  if (mc.jtokm && (done % r.train_cfg.log_interval == 0 || done == r.train_cfg.max_steps)) r.log.write(s.routing.to_json(done));
}

// `step 120/5000 | loss 3.21 | norm 0.81 | lr 6.0e-04 | 412 ms | 31,234 tok/s | ... | ETA 2m03s`:
// a live bar on one line when stdout is a terminal, else one line each.
void print_progress(const TrainRun& r, int64_t done, const StepSums& s, const StepStats& st, double dt, double tps,
                    double mfu, double avg) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | norm %.3f | lr %.2e | %.0f ms | %s tok/s", static_cast<long long>(done),
                static_cast<long long>(r.train_cfg.max_steps), s.loss, st.grad_norm, st.lr, dt * 1e3, with_commas(tps).c_str());
  std::string line = buf;
  if (r.model.cfg.is_moe()) {
    std::snprintf(buf, sizeof buf, " | aux %.4f", s.moe_aux);
    line += buf;
  }
  if (r.model.cfg.jtokm) {
    std::snprintf(buf, sizeof buf, " | jtokm aux %.2e | load max %.2f", s.jtokm_aux, s.routing.max_load_fraction());
    line += buf;
  }
  line += r.tables->progress_note();  // e.g. a store's units read and written
  if (mfu > 0) {
    std::snprintf(buf, sizeof buf, " | MFU %.1f%%", 100 * mfu);
    line += buf;
  }
  line += " | ETA " + human_duration(avg * static_cast<double>(r.train_cfg.max_steps - done));
  if (r.tty) {
    const int width = 20;
    int filled = static_cast<int>(width * done / r.train_cfg.max_steps);
    std::printf("\r\033[K[%s%s] %s", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), line.c_str());
    if (done == r.train_cfg.max_steps) std::printf("\n");
  } else {
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

// The validation batches a validation reads: eval_batches, or with 0 every one of the set once.
int64_t val_batches(const TrainRun& r, const ValSource& val) {
  const int64_t n = r.train_cfg.eval_batches > 0 ? r.train_cfg.eval_batches : val.batches;
  JTOK_CHECK(n > 0, "validation: eval_batches is 0 (the whole validation set) but the set's size is not known");
  return n;
}

// The mean loss over n validation batches, on the GPU with --device cuda.
double mean_val_loss(TrainRun& r, ValSource& val, int64_t n) {
  const TrainConfig& t = r.train_cfg;
  const int64_t B = t.micro_batch_size, T = t.seq_len;
  std::vector<int32_t> x(B * T), y(B * T);
  val.reset();
  double sum = 0;
  cuda::DeviceTrainer* dev = r.tables->device();
  for (int64_t i = 0; i < n; ++i) {
    val.next(x.data(), y.data(), B, T);
    if (dev) {
      sum += dev->eval_loss(x.data(), y.data(), B, T);
      continue;
    }
    forward(r.model, r.acts, x.data(), B, T);
    sum += loss_of_logits(r.model, r.acts, y.data());
  }
  return sum / static_cast<double>(n);
}

}  // namespace

void log_step(TrainRun& r, int64_t done, const StepSums& s, const StepStats& st, double dt) {
  if (done - 1 > r.start_step) {  // the first step pays one-time allocation; keep it out of the ETA
    r.elapsed_train += dt;
    ++r.timed_steps;
  }
  const double tps = static_cast<double>(r.train_cfg.tokens_per_step()) / dt;
  const double avg = r.timed_steps ? r.elapsed_train / r.timed_steps : dt;
  const double mfu = r.opt.peak_gflops > 0 ? tps * r.opt.flops_per_token / 1e9 / r.opt.peak_gflops : 0.0;
  r.result.steps_done = done;
  r.result.last_loss = s.loss;
  write_step_json(r, done, s, st, dt, tps, mfu);
  if (done % r.train_cfg.log_interval == 0 || done == r.train_cfg.max_steps || done == r.start_step + 1)
    print_progress(r, done, s, st, dt, tps, mfu, avg);
}

void maybe_validate(TrainRun& r, int64_t done) {
  if (!r.val || (r.opt.no_checkpoints && !r.opt.validate) ||
      (done % r.train_cfg.eval_interval != 0 && done != r.train_cfg.max_steps))
    return;
  if (!r.tables->device()) r.tables->prepare_reads();  // evaluation reads any row (on the GPU: as it trains)
  const bool reads = r.lead || r.tables->every_rank_reads();  // sharded: every rank serves rows
  const int64_t n = val_batches(r, *r.val);
  const double vl = reads ? mean_val_loss(r, *r.val, n) : 0.0;
  r.tables->after_reads();
  r.result.last_val_loss = vl;
  const int64_t tokens = n * r.train_cfg.micro_batch_size * r.train_cfg.seq_len;
  r.log.write({{"type", "val"},
               {"step", done},
               {"val_loss", vl},
               {"val_ppl", std::exp(vl)},
               {"val_batches", n},
               {"val_tokens", tokens}});
  std::printf("%sval step %lld | val_loss %.4f | ppl %.2f\n", r.tty ? "\n" : "", static_cast<long long>(done), vl, std::exp(vl));
}

void maybe_sample(TrainRun& r, int64_t done) {
  const int64_t every = r.train_cfg.sample_interval;
  if (!r.lead || !r.tables->can_sample() || !r.opt.sample || every <= 0 || done % every != 0) return;
  r.tables->prepare_reads();  // generation reads any row
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
  const TrainConfig& t = r.train_cfg;
  const nlohmann::json st = to_json(TrainerState{.step = step, .run_id = r.run_id, .data = r.data.state(), .sample_rng = r.sample_rng,
                                                 .lr = lr_at(t, std::max<int64_t>(0, step - 1)), .max_steps = t.max_steps});
  const std::string dir = r.tables->save_checkpoint(step, st);  // "" on the ranks that wrote none
  if (!r.lead) return;
  r.log.write({{"type", "checkpoint"}, {"step", step}, {"path", dir}});
  std::printf("checkpoint: %s\n", dir.c_str());
}

}  // namespace jtok
