#include "scaling/plan.h"

#include <cmath>
#include <cstdio>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_int.h"
#include "scaling/flops.h"
#include "scaling/table.h"
#include "train/config.h"

namespace jtok {

namespace {
std::string budget_tag(double c) {  // 3e+18 -> "3e18", 1.5e19 -> "1.5e19"
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", c);
  std::string s = b, o;
  for (char ch : s)
    if (ch != '+') o += ch;
  return o;
}
std::string run_id_of(double budget, const std::string& shape) {  // "C3e18_d128_L4"
  std::string tag = budget_tag(budget);
  std::vector<char> b(tag.size() + shape.size() + 3);
  std::snprintf(b.data(), b.size(), "C%s_%s", tag.c_str(), shape.c_str());
  return std::string(b.data());
}
std::string shape_name(int64_t d, int64_t l) {  // "d128_L4"
  char b[64];
  std::snprintf(b, sizeof b, "d%lld_L%lld", (long long)d, (long long)l);
  return b;
}
std::string safe_name(const std::string& s) {
  std::string o;
  for (char c : s) o += (std::isalnum((unsigned char)c) || c == '_' || c == '-' || c == '.') ? c : '_';
  return o;
}
}  // namespace

nlohmann::json read_json_file(const std::string& path) {
  std::string text = read_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
}

nlohmann::json merged_config(const nlohmann::json& base, const nlohmann::json& overrides, const std::string& origin) {
  if (!overrides.is_object()) fail(origin, ": overrides must be a JSON object, got ", overrides.dump());
  nlohmann::json m = base;
  for (auto it = overrides.begin(); it != overrides.end(); ++it) m[it.key()] = it.value();
  config_from_json(m, origin, /*check=*/true);  // validates; throws naming origin and field
  return m;
}

std::vector<ShapeSpec> read_shapes(const std::string& path, const nlohmann::json& base) {
  nlohmann::json j = read_json_file(path);
  if (j.is_object() && j.contains("shapes")) j = j["shapes"];
  if (!j.is_array() || j.empty()) fail(path, ": expected a non-empty array of shapes (config override objects)");
  std::vector<ShapeSpec> out;
  for (size_t i = 0; i < j.size(); ++i) {
    std::string where = path + ": shape " + std::to_string(i + 1);
    if (!j[i].is_object()) fail(where, ": expected an object of config overrides, got ", j[i].dump());
    ShapeSpec s;
    s.overrides = j[i];
    if (s.overrides.contains("name")) {
      if (!s.overrides["name"].is_string()) fail(where, ": \"name\" must be a string");
      s.name = s.overrides["name"].get<std::string>();
      s.overrides.erase("name");
    }
    Config cfg = config_from_json(merged_config(base, s.overrides, where), where, true);
    if (s.name.empty()) s.name = shape_name(cfg.model.hidden_size, cfg.model.num_hidden_layers);
    s.name = safe_name(s.name);
    for (auto& o : out)
      if (o.name == s.name) fail(where, ": duplicate shape name '", s.name, "'");
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<ShapeSpec> grid_shapes(const nlohmann::json& base, const std::string& origin,
                                   const std::vector<int64_t>& hidden_sizes, const std::vector<int64_t>& layers) {
  Config b = config_from_json(base, origin, true);
  const int64_t hd = b.model.hd();
  const int64_t q_per_kv = b.model.num_attention_heads / b.model.num_key_value_heads;
  const double ffn_ratio = double(b.model.intermediate_size) / double(b.model.hidden_size);
  // MoE: the experts' width scales with d too, so a shape family keeps the base's expert count,
  // top-k and expert/dense width ratio, and N_c (activated) grows like a dense family's.
  const double moe_ratio = double(b.model.moe_intermediate_size) / double(b.model.hidden_size);
  auto round16 = [](double x) { return std::max<int64_t>(16, std::llround(x / 16.0) * 16); };
  std::vector<int64_t> hs = hidden_sizes.empty() ? std::vector<int64_t>{b.model.hidden_size} : hidden_sizes;
  std::vector<int64_t> ls = layers.empty() ? std::vector<int64_t>{b.model.num_hidden_layers} : layers;
  std::vector<ShapeSpec> out;
  for (int64_t d : hs)
    for (int64_t l : ls) {
      if (d <= 0 || l <= 0) fail("shape grid: hidden sizes and layers must be positive, got d=", d, " L=", l);
      if (d % hd != 0) fail("shape grid: hidden size ", d, " is not a multiple of the base head size ", hd);
      int64_t heads = d / hd;
      if (heads % q_per_kv != 0)
        fail("shape grid: hidden size ", d, " gives ", heads, " heads, not a multiple of ", q_per_kv, " q heads per kv head");
      ShapeSpec s;
      s.name = shape_name(d, l);
      s.overrides = {{"hidden_size", d}, {"num_hidden_layers", l}, {"num_attention_heads", heads},
                     {"num_key_value_heads", heads / q_per_kv},
                     {"intermediate_size", round16(ffn_ratio * double(d))}};
      if (b.model.is_moe()) s.overrides["moe_intermediate_size"] = round16(moe_ratio * double(d));
      merged_config(base, s.overrides, origin + " with shape " + s.name);
      out.push_back(std::move(s));
    }
  return out;
}

Plan make_plan(const std::string& base_config_path, const std::vector<ShapeSpec>& shapes,
               const std::vector<double>& budgets, int64_t min_steps, double max_tokens) {
  if (budgets.empty()) fail("scaling plan: no compute budgets given");
  if (shapes.empty()) fail("scaling plan: no model shapes given");
  for (double c : budgets)
    if (!(c > 0) || !std::isfinite(c)) fail("scaling plan: compute budgets must be positive, got ", c);
  nlohmann::json base = read_json_file(base_config_path);
  Plan p;
  p.base_config = base_config_path;
  p.budgets = budgets;
  for (double c : budgets)
    for (auto& s : shapes) {
      Config cfg = config_from_json(merged_config(base, s.overrides, base_config_path + " with shape " + s.name),
                                    base_config_path, true);
      FlopsReport f = flops_report(cfg.model, cfg.train.seq_len);
      PlanRow r;
      r.budget = c;
      r.shape = s.name;
      r.run_id = run_id_of(c, s.name);
      r.overrides = s.overrides;
      r.n_c = f.n_c, r.n_n = f.n_n, r.n_total = f.n_total;  // n_c: activated params only (MoE)
      r.n_experts_inactive = f.n_experts_inactive;
      r.flops_per_token = f.flops_per_token;
      r.tokens_target = c / (6.0 * double(f.n_c));
      r.tokens_per_step = cfg.train.tokens_per_step();
      r.steps = std::llround(r.tokens_target / double(r.tokens_per_step));
      if (r.steps < min_steps) {
        p.skipped.push_back(budget_tag(c) + " x " + s.name + ": " + std::to_string(r.steps) + " steps < min " +
                            std::to_string(min_steps));
        continue;
      }
      r.tokens = r.steps * r.tokens_per_step;
      if (max_tokens > 0 && double(r.tokens) > max_tokens) {
        p.skipped.push_back(budget_tag(c) + " x " + s.name + ": " + std::to_string(r.tokens) + " tokens > max " +
                            fmt_double(max_tokens));
        continue;
      }
      r.compute = 6.0 * double(r.n_c) * double(r.tokens);
      r.compute_exact = r.flops_per_token * double(r.tokens);
      p.rows.push_back(std::move(r));
    }
  return p;
}

nlohmann::json to_json(const Plan& p) {
  nlohmann::json rows = nlohmann::json::array();
  for (auto& r : p.rows)
    rows.push_back({{"run_id", r.run_id}, {"budget", r.budget}, {"shape", r.shape}, {"overrides", r.overrides},
                    {"n_c", r.n_c}, {"n_n", r.n_n}, {"n_total", r.n_total}, {"n_experts_inactive", r.n_experts_inactive},
                    {"flops_per_token", r.flops_per_token},
                    {"tokens_target", r.tokens_target}, {"tokens_per_step", r.tokens_per_step}, {"steps", r.steps},
                    {"tokens", r.tokens}, {"compute", r.compute}, {"compute_exact", r.compute_exact}});
  return {{"base_config", p.base_config}, {"budgets", p.budgets}, {"rows", rows}, {"skipped", p.skipped}};
}

Plan plan_from_json(const nlohmann::json& j, const std::string& origin) {
  Plan p;
  // Integer fields take JSON integers only (a float like 1e300 would convert with undefined behaviour).
  auto int_at = [&](const nlohmann::json& r, const char* k) -> int64_t {
    const nlohmann::json& v = r.at(k);
    const auto x = json_int64(v);
    if (!x) fail(origin, ": field '", k, "' must be an integer, not ", v.dump());
    return *x;
  };
  auto int_or = [&](const nlohmann::json& r, const char* k) -> int64_t { return r.contains(k) ? int_at(r, k) : 0; };
  try {
    p.base_config = j.at("base_config").get<std::string>();
    p.budgets = j.at("budgets").get<std::vector<double>>();
    for (auto& r : j.at("rows")) {
      PlanRow x;
      x.run_id = r.at("run_id").get<std::string>();
      x.budget = r.at("budget").get<double>();
      x.shape = r.at("shape").get<std::string>();
      x.overrides = r.at("overrides");
      x.n_c = int_at(r, "n_c");
      x.n_n = int_or(r, "n_n");
      x.n_total = int_or(r, "n_total");
      x.n_experts_inactive = int_or(r, "n_experts_inactive");
      x.flops_per_token = r.value("flops_per_token", 0.0);
      x.tokens_target = r.value("tokens_target", 0.0);
      x.tokens_per_step = int_at(r, "tokens_per_step");
      x.steps = int_at(r, "steps");
      x.tokens = int_at(r, "tokens");
      x.compute = r.at("compute").get<double>();
      x.compute_exact = r.value("compute_exact", 0.0);
      if (x.run_id.empty() || x.run_id.find('/') != std::string::npos || x.run_id[0] == '.')
        fail(origin, ": bad run_id '", x.run_id, "'");
      if (x.steps <= 0) fail(origin, ": run ", x.run_id, ": steps must be positive");
      p.rows.push_back(std::move(x));
    }
  } catch (const nlohmann::json::exception& e) {
    fail(origin, ": not a plan written by `jtok scaling plan`: ", e.what());
  }
  return p;
}

std::string plan_csv(const Plan& p) {
  std::vector<std::vector<std::string>> rows;
  for (auto& r : p.rows) {
    std::string ov;
    for (auto it = r.overrides.begin(); it != r.overrides.end(); ++it)
      ov += (ov.empty() ? "" : ";") + it.key() + "=" + (it->is_string() ? it->get<std::string>() : it->dump());
    rows.push_back({r.run_id, fmt_double(r.budget), r.shape, std::to_string(r.n_c), std::to_string(r.n_n),
                    std::to_string(r.n_total), std::to_string(r.n_experts_inactive),
                    fmt_double(r.tokens_target), std::to_string(r.tokens_per_step), std::to_string(r.steps),
                    std::to_string(r.tokens), fmt_double(r.compute), fmt_double(r.compute_exact), ov});
  }
  return to_csv({"run_id", "budget", "shape", "n_c", "n_n", "n_total", "n_experts_inactive", "tokens_target", "tokens_per_step", "steps", "tokens",
                 "compute", "compute_exact", "overrides"},
                rows);
}

}  // namespace jtok
