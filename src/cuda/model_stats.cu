// The device model's training telemetry (cuda/model.h): train/telemetry.h's hidden-state spread and
// JTok-M routing counts, read from the forward's activations.
#include <cmath>

#include "cuda/model.h"
#include "cuda/stats.h"

namespace jtok::cuda {

template <typename E>
double hidden_state_std(const DeviceModel<E>& dm, DeviceActs<E>& a) {
  const size_t L = a.layers.size();
  if (L == 0) return 0.0;
  const int64_t n = a.B * a.T * dm.cfg.hidden_size, scratch = sum_and_squares_scratch();
  a.stats.resize(scratch + 2 * static_cast<int64_t>(L));
  double* sums = a.stats.get() + scratch;
  for (size_t l = 0; l < L; ++l) {
    const E* h = l + 1 < L ? a.layers[l + 1].h_in.get() : a.h_out.get();  // layer l's output
    sum_and_squares(sums + 2 * l, h, n, a.stats.get(), dm.stream);
  }
  const double* host = a.readback.read(sums, 2 * static_cast<int64_t>(L), dm.stream);
  double total = 0;
  for (size_t l = 0; l < L; ++l) {  // as the CPU's hidden_state_std
    const double mean = host[2 * l] / static_cast<double>(n);
    total += std::sqrt(std::max(0.0, host[2 * l + 1] / static_cast<double>(n) - mean * mean));
  }
  return total / static_cast<double>(L);
}

template <typename E>
void jtokm_routing(const DeviceModel<E>& dm, const DeviceActs<E>& a, std::vector<std::vector<double>>& load,
                   std::vector<std::vector<double>>& weight_sum) {
  load.clear(), weight_sum.clear();
  const int64_t ne = dm.cfg.jtokm_n_e;
  a.readback.begin(a.layers.size() * (HostReadback::room_for<int32_t>(ne) + HostReadback::room_for<double>(ne)));
  std::vector<std::pair<const int32_t*, const double*>> host;  // a JTok-M layer's load and weight sums
  for (size_t l = 0; l < a.layers.size(); ++l) {
    if (!dm.w.layers[l].jtokm_router) continue;
    host.emplace_back(a.readback.queue(a.layers[l].m_load.get(), ne, dm.stream),
                      a.readback.queue(a.layers[l].m_wsum.get(), ne, dm.stream));
  }
  if (!host.empty()) a.readback.wait(dm.stream);  // no JTok-M layer: no sync
  for (const auto& [n, w] : host) {
    load.emplace_back(n, n + ne);
    weight_sum.emplace_back(w, w + ne);
  }
}

#define JTOK_MODEL_STATS(E)                                                                                   \
  template double hidden_state_std<E>(const DeviceModel<E>&, DeviceActs<E>&);                                 \
  template void jtokm_routing<E>(const DeviceModel<E>&, const DeviceActs<E>&, std::vector<std::vector<double>>&, \
                                 std::vector<std::vector<double>>&);
JTOK_MODEL_STATS(float)
JTOK_MODEL_STATS(__nv_bfloat16)

}  // namespace jtok::cuda
