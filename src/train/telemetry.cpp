#include "train/telemetry.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace jtok {

double hidden_state_std(const Activations& a) {
  const size_t L = a.layers.size();
  if (L == 0) return 0.0;
  double total = 0;
  for (size_t l = 0; l < L; ++l) {
    const std::vector<float>& h = l + 1 < L ? a.layers[l + 1].h_in : a.h_out;  // layer l's output
    double s = 0, ss = 0;
    for (float x : h) { s += x; ss += static_cast<double>(x) * x; }
    const double n = static_cast<double>(h.size()), mean = s / n;
    total += std::sqrt(std::max(0.0, ss / n - mean * mean));
  }
  return total / static_cast<double>(L);
}

RoutingStats::RoutingStats(const Model& m) {
  for (int64_t l = 0; l < m.cfg.num_hidden_layers; ++l)
    if (m.cfg.jtokm_on_layer(l)) layers.push_back(l);
  load.assign(layers.size(), std::vector<double>(static_cast<size_t>(m.cfg.jtokm_n_e), 0.0));
  wsum = load;
}

void RoutingStats::add(const Activations& a) {
  for (size_t k = 0; k < layers.size(); ++k) {
    const JTokMActs& j = a.layers[layers[k]].jtokm;
    for (size_t i = 0; i < load[k].size(); ++i) {
      load[k][i] += j.load[i];
      wsum[k][i] += j.weight_sum[i];
    }
  }
}

void RoutingStats::add(const std::vector<std::vector<double>>& n, const std::vector<std::vector<double>>& w) {
  JTOK_CHECK(n.size() == layers.size() && w.size() == layers.size(), "routing counts of ", n.size(), " and ", w.size(),
             " JTok-M layers, the model has ", layers.size());
  for (size_t k = 0; k < layers.size(); ++k)
    for (size_t i = 0; i < load[k].size(); ++i) {
      load[k][i] += n[k].at(i);
      wsum[k][i] += w[k].at(i);
    }
}

double RoutingStats::max_load_fraction() const {
  double mx = 0;
  for (const auto& l : load) {
    double tot = 0;
    for (double x : l) tot += x;
    for (double x : l) mx = std::max(mx, tot > 0 ? x / tot : 0.0);
  }
  return mx;
}

nlohmann::json RoutingStats::to_json(int64_t step) const {
  nlohmann::json ls = nlohmann::json::array();
  for (size_t k = 0; k < layers.size(); ++k) {
    double tot = 0;
    for (double x : load[k]) tot += x;  // = T K over the step's micro-batches
    std::vector<double> f, w;
    for (size_t i = 0; i < load[k].size(); ++i) {
      f.push_back(tot > 0 ? load[k][i] / tot : 0.0);
      w.push_back(load[k][i] > 0 ? wsum[k][i] / load[k][i] : 0.0);
    }
    ls.push_back({{"layer", layers[k]}, {"load", f}, {"mean_weight", w}});
  }
  return {{"type", "routing"}, {"step", step}, {"layers", ls}};
}

}  // namespace jtok
