// The GPU placement (train/tables_cuda.h).
#include "train/tables_cuda.h"

#include <cstdio>
#include <string>

#include "core/error.h"
#include "cuda/training.h"
#include "train/checkpoint.h"
#include "train/jsonl_log.h"
#include "train/loopback_trainer.h"
#include "train/schedule.h"

namespace jtok {

cuda::HostAdamWView host_adamw_view(AdamWState& a) {
  cuda::HostAdamWView v;
  v.m = a.m.data();
  v.v = a.v.data();
  v.moment_offset = a.moment_offset;
  for (size_t k = 0; k < a.tables.m.size(); ++k) {
    v.table_m.push_back(a.tables.m[k].data());
    v.table_v.push_back(a.tables.v[k].data());
  }
  v.step = a.step;
  return v;
}

namespace {

// "GPU attention, query rows a warp: forward 32 (16: 0.812 ms, 32: 0.655 ms), backward 16 (...)": what
// the device trainer timed and chose; timings absent where none ran (hd 128).
std::string attention_rows_line(const cuda::AttentionRows& r) {
  auto part = [](const char* what, int rows, const double(&ms)[2]) {
    char buf[160];
    if (ms[0] > 0)
      std::snprintf(buf, sizeof buf, "%s %d (16: %.3f ms, 32: %.3f ms)", what, rows, ms[0], ms[1]);
    else
      std::snprintf(buf, sizeof buf, "%s %d (untimed: no 32-row kernels at this head dim)", what, rows);
    return std::string(buf);
  };
  return "GPU attention, query rows a warp: " + part("forward", r.fwd, r.fwd_ms) + ", " +
         part("backward", r.bwd, r.bwd_ms) + "; the same bits either way";
}

class TablesOnGpu final : public TablePlacement {
 public:
  using TablePlacement::TablePlacement;
  bool model_allocates_tables(bool, bool) const override { return true; }
  bool model_loads_tables() const override { return true; }
  void start_fresh() override {
    p_.adam = make_adamw_state(p_.model);
    make_trainer();
  }
  void check_resumable(const std::string& ck) const override { refuse_table_store_checkpoint(ck); }
  void resume(const std::string&, int64_t) override { make_trainer(); }
  void attach(Activations&, JsonlLog& log, int64_t) override {
    std::string what = trainer_->describe();
    if (!p_.cfg.train.table_dedup)
      what += "; table_dedup false: token-table rows gathered and scattered a position at a time (fp32 atomics, "
              "not bitwise reproducible)";
    if (p_.cfg.train.table_streams) what += "; table AdamW and row syncs on side streams";
    std::printf("device: %s\n", what.c_str());
    log.write({{"type", "device"},
               {"device", p_.opt.device},
               {"trainer", what},
               {"table_dedup", p_.cfg.train.table_dedup},
               {"table_streams", p_.cfg.train.table_streams}});
    log_ = &log;
  }
  // Once the first forward has timed them (bf16): the attention kernels' rows a warp, said and logged.
  void begin_step(int64_t, BatchSource&) override {
    if (said_attention_rows_ || !log_) return;
    const cuda::AttentionRows r = trainer_->attention_rows();
    if (r.fwd == 0) return;
    said_attention_rows_ = true;
    std::printf("%s\n", attention_rows_line(r).c_str());
    nlohmann::json record = attention_rows_json(r);
    record["type"] = "attention_rows";
    log_->write(record);
  }
  bool rows_in_model() const override { return true; }
  void prepare_reads() override { trainer_->download(p_.model, nullptr); }  // weights and tables, every row current
  cuda::DeviceTrainer* device() override { return trainer_.get(); }
  std::string save_checkpoint(int64_t step, const nlohmann::json& state) override {
    const cuda::HostAdamWView view = host_adamw_view(p_.adam);
    trainer_->download(p_.model, &view);
    mark_tables_current(p_.model, p_.adam);  // the device brought every row to p_.adam.step
    return save_on_lead(step, state);
  }

 private:
  void make_trainer() {
    const TrainConfig& t = p_.cfg.train;
    if (p_.opt.device == "loopback") {
      trainer_ = make_loopback_trainer(p_.model, host_adamw_view(p_.adam), t);
      return;
    }
    const cuda::DeviceTableOptions tables{t.table_optimizer != "sparse", t.table_optimizer == "dense-eager",
                                          t.table_dedup, t.table_streams};
    trainer_ = cuda::make_device_trainer(p_.model, host_adamw_view(p_.adam), t.precision == "bf16", tables);
  }
  std::unique_ptr<cuda::DeviceTrainer> trainer_;
  JsonlLog* log_ = nullptr;  // the run's log (attach's)
  bool said_attention_rows_ = false;
};

cuda::StepConsts step_consts(const TrainConfig& t, const StepStats& st, int64_t step) {
  auto at = [&](double lr, bool decay) {
    const AdamWStepConsts k =
        adamw_consts(AdamWHyper{static_cast<float>(lr), static_cast<float>(t.adam_beta1), static_cast<float>(t.adam_beta2),
                                static_cast<float>(t.adam_epsilon), decay ? static_cast<float>(t.weight_decay) : 0.0f,
                                step, 1.0f});
    return cuda::AdamWConsts{k.b1, k.b2, k.eps, k.step_size, k.inv_sqrt_bc2, k.decay};
  };
  return {at(st.lr, true), at(st.lr, false), at(st.table_lr, true), at(st.table_lr, false)};
}

}  // namespace

std::unique_ptr<TablePlacement> make_tables_on_gpu(const TableRunParts& p) {
  if (p.opt.tables != "ram")
    fail("--device cuda keeps the token tables in GPU memory: --tables ", p.opt.tables, " trains on the CPU only");
  if (p.opt.embp != "off") fail("--device cuda trains on one GPU: --embp ", p.opt.embp, " is for mpirun on CPUs");
  if (p.share.ranks > 1) fail("--device cuda trains on one GPU: run it without mpirun (", p.share.ranks, " ranks)");
  return std::make_unique<TablesOnGpu>(p);
}

nlohmann::json attention_rows_json(const cuda::AttentionRows& r) {
  return {{"forward", r.fwd},
          {"backward", r.bwd},
          {"forward_ms", {r.fwd_ms[0], r.fwd_ms[1]}},
          {"backward_ms", {r.bwd_ms[0], r.bwd_ms[1]}}};
}

StepStats device_optimizer_step(cuda::DeviceTrainer& dev, AdamWState& state, const TrainConfig& t) {
  StepStats st;
  st.lr = lr_at(t, state.step);
  st.table_lr = t.table_learning_rate < 0 ? st.lr : st.lr * (t.table_learning_rate / t.learning_rate);
  st.grad_norm = dev.optimizer_step(step_consts(t, st, state.step + 1), static_cast<float>(t.max_grad_norm));
  st.clip_coef = 1.0;
  if (t.max_grad_norm > 0) {  // as optimizer_step's: for the log (the device computed its own)
    const float coef = static_cast<float>(t.max_grad_norm) / (static_cast<float>(st.grad_norm) + 1e-6f);
    if (coef < 1.0f) st.clip_coef = coef;
  }
  state.step += 1;
  copy_replay_counts(dev, state.tables);
  return st;
}

void copy_replay_counts(const cuda::DeviceTrainer& dev, TableMoments& tables) {
  cuda::DeviceTrainer::ReplayCounts c;
  if (!dev.replay_counts(c)) return;
  tables.replayed_rows = c.rows;
  tables.replayed_warm_rows = c.warm_rows;
  tables.replayed_warm_steps = c.warm_steps;
  tables.stepped_rows = c.stepped_rows;
}

}  // namespace jtok
