// The loopback device trainer (train/loopback_trainer.h).
#include "train/loopback_trainer.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "train/optimizer.h"
#include "train/schedule.h"
#include "train/telemetry.h"

namespace jtok {

namespace {

// n floats of src into dst.
void copy_floats(float* dst, const float* src, size_t n) {
  if (n) std::memcpy(dst, src, n * sizeof(float));
}

// The host's AdamW constants of one kind at the loopback's own step: what the host sent must be
// these floats (a host and a device whose step counts drifted apart fail here).
bool same_consts(const cuda::AdamWConsts& a, const AdamWStepConsts& b) {
  return a.b1 == b.b1 && a.b2 == b.b2 && a.eps == b.eps && a.step_size == b.step_size &&
         a.inv_sqrt_bc2 == b.inv_sqrt_bc2 && a.decay == b.decay;
}

class LoopbackTrainer final : public cuda::DeviceTrainer {
 public:
  LoopbackTrainer(const Model& host, const cuda::HostAdamWView& adam, const TrainConfig& t)
      : t_(t), m_(make_model(host.cfg, 0, {.init = false, .grads = true, .tables = true})) {
    m_.backbone_frozen = host.backbone_frozen;
    copy_floats(m_.params.data(), host.params.data(), host.params.size());
    for (size_t k = 0; k < host.tables.size(); ++k)
      copy_floats(m_.tables[k].mutable_data(), host.tables[k].data(), static_cast<size_t>(host.tables[k].numel()));
    adam_ = make_adamw_state(m_);
    copy_floats(adam_.m.data(), adam.m, adam_.m.size());
    copy_floats(adam_.v.data(), adam.v, adam_.v.size());
    JTOK_CHECK(adam.table_m.size() == m_.tables.size(), "--device loopback: moments for ", adam.table_m.size(),
               " tables, the model has ", m_.tables.size());
    for (size_t k = 0; k < m_.tables.size(); ++k) {
      copy_floats(adam_.tables.m[k].data(), adam.table_m[k], adam_.tables.m[k].size());
      copy_floats(adam_.tables.v[k].data(), adam.table_v[k], adam_.tables.v[k].size());
    }
    adam_.step = adam.step;
    mark_tables_current(m_, adam_);
    acts_.row_sync = table_row_sync(m_, adam_);
  }

  void zero_grads() override { jtok::zero_grads(m_); }
  cuda::MicroBatchLoss forward_backward(const int32_t* x, const int32_t* y, int64_t B, int64_t T, float grad_scale,
                                        bool hidden_std) override {
    forward(m_, acts_, x, B, T);
    cuda::MicroBatchLoss r;
    if (hidden_std) r.hidden_std = hidden_state_std(acts_);
    for (int64_t l = 0; l < m_.cfg.num_hidden_layers; ++l) {
      if (!m_.cfg.jtokm_on_layer(l)) continue;
      const JTokMActs& j = acts_.layers[static_cast<size_t>(l)].jtokm;
      r.jtokm_load.emplace_back(j.load.begin(), j.load.end());
      r.jtokm_weight_sum.push_back(j.weight_sum);
    }
    r.loss = backward(m_, acts_, x, y, grad_scale);
    r.moe_aux = acts_.moe_aux_loss;
    r.jtokm_aux = acts_.jtokm_aux_loss;
    return r;
  }
  double eval_loss(const int32_t* x, const int32_t* y, int64_t B, int64_t T) override {
    forward(m_, acts_, x, B, T);
    return loss_of_logits(m_, acts_, y);
  }
  double optimizer_step(const cuda::StepConsts& c, float) override {
    check_consts(c);
    return jtok::optimizer_step(m_, adam_, t_).grad_norm;
  }
  void finish() override { sync_tables(m_, adam_); }
  void download(Model& host, const cuda::HostAdamWView* adam) override;
  void poison_gradient() override { m_.grads[m_.grads.size() / 2] = std::numeric_limits<float>::quiet_NaN(); }
  void poison_table_row(int64_t table, int64_t row) override {
    m_.tables.at(static_cast<size_t>(table)).mutable_row(row)[0] = std::numeric_limits<float>::quiet_NaN();
  }
  std::string describe() const override { return "loopback: the CPU engine behind the GPU trainer's interface"; }

 private:
  void check_consts(const cuda::StepConsts& c) const;
  const TrainConfig t_;
  Model m_;
  AdamWState adam_;
  Activations acts_;
};

void LoopbackTrainer::check_consts(const cuda::StepConsts& c) const {
  const int64_t step = adam_.step + 1;
  const double lr = lr_at(t_, adam_.step);
  const AdamWStepConsts want = adamw_consts(AdamWHyper{static_cast<float>(lr), static_cast<float>(t_.adam_beta1),
                                                       static_cast<float>(t_.adam_beta2), static_cast<float>(t_.adam_epsilon),
                                                       static_cast<float>(t_.weight_decay), step, 1.0f});
  if (!same_consts(c.decay, want))
    fail("--device loopback: the host sent the AdamW constants of another step than ", step, " (lr ", lr, ")");
}

void LoopbackTrainer::download(Model& host, const cuda::HostAdamWView* adam) {
  sync_tables(m_, adam_);
  copy_floats(host.params.data(), m_.params.data(), m_.params.size());
  for (size_t k = 0; k < m_.tables.size(); ++k)
    copy_floats(host.tables[k].mutable_data(), m_.tables[k].data(), static_cast<size_t>(m_.tables[k].numel()));
  if (!adam) return;
  copy_floats(adam->m, adam_.m.data(), adam_.m.size());
  copy_floats(adam->v, adam_.v.data(), adam_.v.size());
  for (size_t k = 0; k < m_.tables.size(); ++k) {
    copy_floats(adam->table_m[k], adam_.tables.m[k].data(), adam_.tables.m[k].size());
    copy_floats(adam->table_v[k], adam_.tables.v[k].data(), adam_.tables.v[k].size());
  }
}

}  // namespace

std::unique_ptr<cuda::DeviceTrainer> make_loopback_trainer(const Model& host, const cuda::HostAdamWView& adam,
                                                           const TrainConfig& t) {
  return std::make_unique<LoopbackTrainer>(host, adam, t);
}

}  // namespace jtok
