// Training telemetry beyond the loss: JTok-M routing per layer and the hidden-state scale.
#pragma once
#include <cstdint>
#include <vector>
#include <nlohmann/json.hpp>

#include "model/transformer.h"

namespace jtok {

// Standard deviation of each layer's output hidden states over tokens and dimensions, averaged over
// layers (the paper's Appendix E.1 figure). From the activations of a forward.
double hidden_state_std(const Activations& acts);

// JTok-M routing of one optimizer step, summed over its micro-batches: per JTok-M layer, the load
// fraction f_i = n_i / (T K) of each table and the mean mixing weight of the tokens that chose it.
struct RoutingStats {
  std::vector<int64_t> layers;                   // JTok-M layers
  std::vector<std::vector<double>> load, wsum;   // per layer, per table: n_i and sum of w
  explicit RoutingStats(const Model& m);
  void add(const Activations& acts);
  void add(const std::vector<std::vector<double>>& load, const std::vector<std::vector<double>>& weight_sum);  // per layer, per table
  double max_load_fraction() const;              // the busiest table's f_i over all layers (1/n_e = balanced)
  nlohmann::json to_json(int64_t step) const;    // {"type": "routing", "step", "layers": [{layer, load, mean_weight}]}
};

}  // namespace jtok
