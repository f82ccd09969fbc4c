// The run grid of an isoFLOPs study (paper section 3.1.2): for each compute budget C and each
// model shape, train for D = C / (6 N_c) tokens, i.e. round(D / tokens_per_step) steps.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace jtok {

// A model shape: config overrides applied on top of the base config file.
struct ShapeSpec {
  std::string name;
  nlohmann::json overrides = nlohmann::json::object();
};

// Shapes from a JSON file: an array of override objects, or {"shapes": [...]}. A "name" key in
// an object names the shape (default "d<hidden>_L<layers>"); every other key is a config field.
std::vector<ShapeSpec> read_shapes(const std::string& path, const nlohmann::json& base);

// Shapes from lists of hidden sizes and layer counts (their product). The base's head size,
// q/kv head ratio and MLP ratio are kept: heads = d / hd, kv heads = heads / (q per kv),
// intermediate_size = base ratio * d rounded to a multiple of 16; for an MoE base also
// moe_intermediate_size (experts, top-k and first_k_dense_replace stay the base's).
std::vector<ShapeSpec> grid_shapes(const nlohmann::json& base, const std::string& origin,
                                   const std::vector<int64_t>& hidden_sizes, const std::vector<int64_t>& layers);

struct PlanRow {
  std::string run_id;        // directory name of the run: C<budget>_<shape>
  double budget = 0;         // C (FLOPs), nominal
  std::string shape;
  nlohmann::json overrides;  // the shape's config overrides
  int64_t n_c = 0, n_n = 0, n_total = 0;  // n_c counts activated params only (MoE: shared + top-k experts)
  int64_t n_experts_inactive = 0;           // MoE: routed-expert params not activated per token
  double flops_per_token = 0;  // exact training FLOPs per token (see flops.h)
  double tokens_target = 0;    // D = C / (6 N_c)
  int64_t tokens_per_step = 0;
  int64_t steps = 0;           // round(D / tokens_per_step)
  int64_t tokens = 0;          // steps * tokens_per_step (what is actually trained)
  double compute = 0;          // 6 N_c tokens (the paper's accounting of what is trained)
  double compute_exact = 0;    // flops_per_token * tokens
};

struct Plan {
  std::string base_config;     // path of the base config file
  std::vector<double> budgets;
  std::vector<PlanRow> rows;
  std::vector<std::string> skipped;  // "budget x shape: reason" for grid points left out
};

// Builds the grid; shapes too large for a budget (fewer than min_steps steps) are skipped, and
// with max_tokens > 0 so are shapes too small for it (more than max_tokens tokens: more than the
// data holds, or more wall time than the study can spend; the LM head makes small models slow).
Plan make_plan(const std::string& base_config_path, const std::vector<ShapeSpec>& shapes,
               const std::vector<double>& budgets, int64_t min_steps, double max_tokens = 0);

nlohmann::json to_json(const Plan& p);
Plan plan_from_json(const nlohmann::json& j, const std::string& origin);
std::string plan_csv(const Plan& p);

// Reads a config file as raw JSON (kept raw so fields this code does not know survive).
nlohmann::json read_json_file(const std::string& path);
// base + overrides, validated as a Config (fails naming `origin`).
nlohmann::json merged_config(const nlohmann::json& base, const nlohmann::json& overrides, const std::string& origin);

}  // namespace jtok
