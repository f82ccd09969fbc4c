// trainer_state.json: what a checkpoint holds besides the weights and the optimizer moments
// (train/checkpoint.h): the step, the run id, the data loader's position, the sample RNG, and, for
// reading by people, the learning rate and max_steps. Parsed in one place so that every field a
// resume reads is checked: a file that is not JSON, a missing field or one of the wrong type is
// refused with a jtok::Error naming the file and the field (tests/fuzz/fuzz_trainer_state.cpp).
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace jtok {

struct TrainerState {
  int64_t step = 0;
  std::string run_id;          // "" for a checkpoint written before run ids
  nlohmann::json data;         // the BatchSource's state (data/loader.h: LoaderState), an object
  std::mt19937_64 sample_rng;  // the periodic samples' RNG
  double lr = 0;               // informative only
  int64_t max_steps = 0;       // informative only
};

nlohmann::json to_json(const TrainerState& s);
// where: the file, for messages. Fails on anything a resume could not use.
TrainerState parse_trainer_state(const nlohmann::json& j, const std::string& where);
TrainerState parse_trainer_state_text(std::string_view text, const std::string& where);

}  // namespace jtok
