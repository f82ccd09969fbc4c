#include "model/config.h"

#include <cmath>
#include <sstream>

#include "core/error.h"

namespace jtok {

std::vector<bool> parse_layer_set(const std::string& spec, int64_t n) {
  std::vector<bool> on(static_cast<size_t>(n), false);
  if (spec == "all") return std::vector<bool>(static_cast<size_t>(n), true);
  if (spec == "none" || spec.empty()) return on;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int64_t a, b;
    char dash;
    std::istringstream is(item);
    if (!(is >> a)) fail("bad layer list '", spec, "'");
    b = a;
    if (is >> dash) {
      if (dash != '-' || !(is >> b)) fail("bad layer list '", spec, "'");
    }
    if (a < 0 || b >= n || a > b) fail("layer range '", item, "' outside 0..", n - 1);
    for (int64_t l = a; l <= b; ++l) on[static_cast<size_t>(l)] = true;
  }
  return on;
}

// Layers a module with this switch and layer list covers: the list is parsed once per count.
static int64_t count_layers(bool on, const std::string& spec, int64_t n) {
  if (!on) return 0;
  int64_t k = 0;
  for (bool b : parse_layer_set(spec, n)) k += b;
  return k;
}

bool ModelConfig::jtok_on_layer(int64_t l) const {
  return jtok && parse_layer_set(jtok_layers, num_hidden_layers)[static_cast<size_t>(l)];
}

int64_t ModelConfig::jtok_num_layers() const { return count_layers(jtok, jtok_layers, num_hidden_layers); }

bool ModelConfig::jtokm_on_layer(int64_t l) const {
  return jtokm && parse_layer_set(jtokm_layers, num_hidden_layers)[static_cast<size_t>(l)];
}

int64_t ModelConfig::jtokm_num_layers() const { return count_layers(jtokm, jtokm_layers, num_hidden_layers); }

bool ModelConfig::moe_on_layer(int64_t l) const {
  if (!is_moe() || l < first_k_dense_replace || (l + 1) % decoder_sparse_step != 0) return false;
  return mlp_only_layers.empty() || !parse_layer_set(mlp_only_layers, num_hidden_layers)[static_cast<size_t>(l)];
}

int64_t ModelConfig::moe_num_layers() const {
  int64_t k = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l) k += moe_on_layer(l);
  return k;
}

}  // namespace jtok
