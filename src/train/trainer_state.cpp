#include "train/trainer_state.h"

#include <sstream>

#include "core/error.h"
#include "core/json_int.h"

namespace jtok {

nlohmann::json to_json(const TrainerState& s) {
  std::ostringstream rng;
  rng << s.sample_rng;
  return {{"step", s.step}, {"run_id", s.run_id}, {"data", s.data}, {"sample_rng", rng.str()},
          {"lr", s.lr}, {"max_steps", s.max_steps}};
}

TrainerState parse_trainer_state(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail(where, ": trainer state must be a JSON object, not ", j.type_name());
  TrainerState s;
  auto need = [&](const char* k) -> const nlohmann::json& {
    if (!j.contains(k)) fail(where, ": missing field '", k, "'");
    return j[k];
  };
  const auto& step = need("step");
  const auto step_value = json_int64(step);
  if (!step_value || *step_value < 0) fail(where, ": field 'step' must be a non-negative 64-bit integer, not ", step.dump());
  s.step = *step_value;
  s.data = need("data");
  if (!s.data.is_object()) fail(where, ": field 'data' (the data loader's state) must be an object, not ", s.data.type_name());
  const auto& rng = need("sample_rng");
  if (!rng.is_string()) fail(where, ": field 'sample_rng' must be a string, not ", rng.type_name());
  std::istringstream in(rng.get<std::string>());
  in >> s.sample_rng;
  if (in.fail()) fail(where, ": field 'sample_rng' is not a saved mt19937_64 state");
  in >> std::ws;
  if (!in.eof()) fail(where, ": field 'sample_rng' has text after the mt19937_64 state");
  if (j.contains("run_id")) {
    if (!j["run_id"].is_string()) fail(where, ": field 'run_id' must be a string, not ", j["run_id"].type_name());
    s.run_id = j["run_id"].get<std::string>();
  }
  if (j.contains("lr")) {
    if (!j["lr"].is_number()) fail(where, ": field 'lr' must be a number, not ", j["lr"].type_name());
    s.lr = j["lr"].get<double>();
  }
  if (j.contains("max_steps")) {
    const auto max_steps = json_int64(j["max_steps"]);
    if (!max_steps) fail(where, ": field 'max_steps' must be a 64-bit integer, not ", j["max_steps"].dump());
    s.max_steps = *max_steps;
  }
  return s;
}

TrainerState parse_trainer_state_text(std::string_view text, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) fail(where, " is not valid JSON");
  return parse_trainer_state(j, where);
}

}  // namespace jtok
