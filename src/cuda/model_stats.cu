// The device model's training telemetry (cuda/model.h): train/telemetry.h's hidden-state spread and
// JTok-M routing counts, read from the forward's activations.
#include <cmath>

#include "cuda/model.h"
#include "cuda/stats.h"
#include "model/jtokm.h"

namespace jtok::cuda {

template <typename E>
void queue_hidden_state_std(const DeviceModel<E>& dm, DeviceActs<E>& a) {
  const size_t L = a.layers.size();
  a.hidden_sums = nullptr;
  if (L == 0) return;
  const int64_t n = a.B * a.T * dm.cfg.hidden_size, scratch = sum_and_squares_scratch();
  a.stats.resize(scratch + 2 * static_cast<int64_t>(L));
  double* sums = a.stats.get() + scratch;
  for (size_t l = 0; l < L; ++l) {
    const E* h = l + 1 < L ? a.layers[l + 1].h_in.get() : a.h_out.get();  // layer l's output
    sum_and_squares(sums + 2 * l, h, n, a.stats.get(), dm.stream);
  }
  a.stats_readback.begin(HostReadback::room_for<double>(2 * static_cast<int64_t>(L)));
  a.hidden_sums = a.stats_readback.queue(sums, 2 * static_cast<int64_t>(L), dm.stream);
}

template <typename E>
double hidden_state_std(const DeviceModel<E>& dm, DeviceActs<E>& a) {
  const size_t L = a.layers.size();
  if (L == 0) return 0.0;
  JTOK_CHECK(a.hidden_sums, "hidden_state_std: no sums queued (queue_hidden_state_std after the forward)");
  a.stats_readback.wait(dm.stream);  // at once where the stream was waited for already
  const double* host = a.hidden_sums;
  a.hidden_sums = nullptr;
  const int64_t n = a.B * a.T * dm.cfg.hidden_size;
  double total = 0;
  for (size_t l = 0; l < L; ++l) {  // as the CPU's hidden_state_std
    const double mean = host[2 * l] / static_cast<double>(n);
    total += std::sqrt(std::max(0.0, host[2 * l + 1] / static_cast<double>(n) - mean * mean));
  }
  return total / static_cast<double>(L);
}

template <typename E>
JTokMRouting jtokm_routing(const DeviceModel<E>& dm, const DeviceActs<E>& a) {
  const int64_t ne = dm.cfg.jtokm_n_e;
  a.readback.begin(a.layers.size() * (HostReadback::room_for<int32_t>(ne) + 2 * HostReadback::room_for<double>(ne)));
  struct Layer {
    const int32_t* load;
    const double *weight_sum, *prob_sum;
  };
  std::vector<Layer> host;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    if (!dm.w.layers[l].jtokm_router) continue;
    const DeviceLayerActs<E>& L = a.layers[l];
    host.push_back({a.readback.queue(L.m_load.get(), ne, dm.stream), a.readback.queue(L.m_wsum.get(), ne, dm.stream),
                    a.readback.queue(L.m_prob_sum.get(), ne, dm.stream)});
  }
  JTokMRouting r;
  if (host.empty()) return r;  // no JTok-M layer: no sync
  a.readback.wait(dm.stream);
  const JTokMHyper hp = jtokm_hyper(dm.cfg);
  double aux = 0;
  for (const Layer& h : host) {
    r.load.emplace_back(h.load, h.load + ne);
    r.weight_sum.emplace_back(h.weight_sum, h.weight_sum + ne);
    aux += jtokm_aux_loss(h.prob_sum, r.load.back().data(), a.B * a.T, hp);
  }
  r.aux = aux / static_cast<double>(host.size());
  return r;
}

#define JTOK_MODEL_STATS(E)                                                       \
  template void queue_hidden_state_std<E>(const DeviceModel<E>&, DeviceActs<E>&); \
  template double hidden_state_std<E>(const DeviceModel<E>&, DeviceActs<E>&);     \
  template JTokMRouting jtokm_routing<E>(const DeviceModel<E>&, const DeviceActs<E>&);
JTOK_MODEL_STATS(float)
JTOK_MODEL_STATS(__nv_bfloat16)

}  // namespace jtok::cuda
