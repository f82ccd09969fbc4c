// What the host reads of a micro-batch's forward (cuda/model.h's queue_forward_stats): the MoE and
// JTok-M aux losses, train/telemetry.h's hidden-state spread and JTok-M routing counts.
#include <cmath>
#include <vector>

#include "cuda/model.h"
#include "cuda/stats.h"
#include "model/jtokm.h"

namespace jtok::cuda {

namespace {

// Each layer's output sums (sum, sum of squares: 2 L doubles) on the device, in a.stats after its scratch.
template <typename E>
const double* layer_output_sums(const DeviceModel<E>& dm, DeviceActs<E>& a) {
  const size_t L = a.layers.size();
  const int64_t n = a.B * a.T * dm.cfg.hidden_size, scratch = sums_and_squares_scratch(static_cast<int64_t>(L));
  a.stats.resize(scratch + 2 * static_cast<int64_t>(L));
  double* sums = a.stats.get() + scratch;
  std::vector<const E*> outputs(L);
  for (size_t l = 0; l < L; ++l) outputs[l] = l + 1 < L ? a.layers[l + 1].h_in.get() : a.h_out.get();  // layer l's
  sums_and_squares(sums, outputs, n, a.stats.get(), dm.stream);
  return sums;
}

// As the CPU's hidden_state_std, from each layer's two sums over n values.
double hidden_std_from_sums(const double* sums, size_t L, int64_t n) {
  double total = 0;
  for (size_t l = 0; l < L; ++l) {
    const double mean = sums[2 * l] / static_cast<double>(n);
    total += std::sqrt(std::max(0.0, sums[2 * l + 1] / static_cast<double>(n) - mean * mean));
  }
  return total / static_cast<double>(L);
}

// The JTok-M layers' routing from their sums on the host (as jtokm_route_stats left them).
template <typename E>
JTokMRouting routing_from_sums(const DeviceModel<E>& dm, const DeviceActs<E>& a) {
  const int64_t ne = dm.cfg.jtokm_n_e;
  JTokMRouting r;
  if (a.queued.jtokm.empty()) return r;
  const JTokMHyper hp = jtokm_hyper(dm.cfg);
  double aux = 0;
  for (const QueuedForwardStats::Routing& h : a.queued.jtokm) {
    r.load.emplace_back(h.load, h.load + ne);
    r.weight_sum.emplace_back(h.weight_sum, h.weight_sum + ne);
    aux += jtokm_aux_loss(h.prob_sum, r.load.back().data(), a.B * a.T, hp);
  }
  r.aux = aux / static_cast<double>(a.queued.jtokm.size());
  return r;
}

}  // namespace

template <typename E>
void queue_forward_stats(const DeviceModel<E>& dm, DeviceActs<E>& a, bool hidden_std) {
  if (a.queued.on) a.stats_readback.wait(dm.stream);  // a micro-batch's values never read (its step stopped)
  const size_t L = a.layers.size();
  const int64_t ne = dm.cfg.jtokm_n_e;
  a.stats_readback.begin(HostReadback::room_for<double>(2 * static_cast<int64_t>(L)) +
                         L * (HostReadback::room_for<double>(1) + HostReadback::room_for<int32_t>(ne) +
                              2 * HostReadback::room_for<double>(ne)));
  QueuedForwardStats& q = a.queued;
  q = {};
  q.on = true;
  if (hidden_std && L > 0)
    q.hidden_sums = a.stats_readback.queue(layer_output_sums(dm, a), 2 * static_cast<int64_t>(L), dm.stream);
  for (size_t l = 0; l < L; ++l)
    if (dm.w.layers[l].moe.router) q.moe_aux.push_back(a.stats_readback.queue(a.layers[l].moe.aux.get(), 1, dm.stream));
  for (size_t l = 0; l < L; ++l) {
    if (!dm.w.layers[l].jtokm_router) continue;
    const DeviceLayerActs<E>& A = a.layers[l];
    q.jtokm.push_back({a.stats_readback.queue(A.m_load.get(), ne, dm.stream),
                       a.stats_readback.queue(A.m_wsum.get(), ne, dm.stream),
                       a.stats_readback.queue(A.m_prob_sum.get(), ne, dm.stream)});
  }
}

template <typename E>
ForwardStats read_forward_stats(const DeviceModel<E>& dm, DeviceActs<E>& a, bool stream_waited) {
  JTOK_CHECK(a.queued.on, "read_forward_stats: nothing queued (queue_forward_stats after the forward)");
  const QueuedForwardStats& q = a.queued;
  const bool any = q.hidden_sums || !q.moe_aux.empty() || !q.jtokm.empty();
  if (stream_waited || !any)
    a.stats_readback.waited();  // nothing to wait for
  else
    a.stats_readback.wait(dm.stream);
  ForwardStats r;
  if (q.hidden_sums)
    r.hidden_std = hidden_std_from_sums(q.hidden_sums, a.layers.size(), a.B * a.T * dm.cfg.hidden_size);
  for (const double* aux : q.moe_aux) r.moe_aux += *aux;
  if (!q.moe_aux.empty()) r.moe_aux /= static_cast<double>(q.moe_aux.size());
  r.routing = routing_from_sums(dm, a);
  a.queued = {};
  return r;
}

template <typename E>
double moe_aux_loss(const DeviceModel<E>& dm, DeviceActs<E>& a) {
  queue_forward_stats(dm, a, false);
  return read_forward_stats(dm, a, false).moe_aux;
}

template <typename E>
JTokMRouting jtokm_routing(const DeviceModel<E>& dm, DeviceActs<E>& a) {
  queue_forward_stats(dm, a, false);
  return read_forward_stats(dm, a, false).routing;
}

#define JTOK_MODEL_STATS(E)                                                                 \
  template void queue_forward_stats<E>(const DeviceModel<E>&, DeviceActs<E>&, bool);        \
  template ForwardStats read_forward_stats<E>(const DeviceModel<E>&, DeviceActs<E>&, bool); \
  template double moe_aux_loss<E>(const DeviceModel<E>&, DeviceActs<E>&);                   \
  template JTokMRouting jtokm_routing<E>(const DeviceModel<E>&, DeviceActs<E>&);
JTOK_MODEL_STATS(float)
JTOK_MODEL_STATS(__nv_bfloat16)

}  // namespace jtok::cuda
