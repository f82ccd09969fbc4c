// Training checkpoints: one directory per step under the run directory,
//   <run>/checkpoints/step_00001200/{model.safetensors, optimizer.safetensors, trainer_state.json,
//                                     config.json, COMPLETE}
// Written into "<name>.tmp", each file fsynced, the directory renamed, and the COMPLETE marker
// written last: a checkpoint without COMPLETE is never loaded, so a crash mid-write leaves the
// previous checkpoint as the newest complete one.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/transformer.h"
#include "train/optimizer.h"

namespace jtok {

std::string checkpoint_dir_name(int64_t step);

// trainer_state: step, RNG and data loader state, schedule; saved verbatim as trainer_state.json.
std::string save_checkpoint(const std::string& run_dir, int64_t step, const Config& cfg, const Model& m,
                            const AdamWState& opt, const nlohmann::json& trainer_state, int64_t keep_last);

// Newest complete checkpoint directory under run_dir/checkpoints, if any.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);

// The config stored with a checkpoint (config.json), validated.
Config load_checkpoint_config(const std::string& ckpt_dir);
// Loads the weights into m (built from the checkpoint's config); with opt, the optimizer state too
// (training: a checkpoint with bf16 / int8 tables, an inference export, is refused). Returns trainer_state.json. Errors name the file on anything missing, truncated or mismatched.
nlohmann::json load_checkpoint(const std::string& ckpt_dir, Model& m, AdamWState* opt);
// Inference only: the weights of a complete checkpoint with its token tables left in
// model.safetensors, mapped read-only and read in place (load_weights_mapped).
void load_checkpoint_mapped(const std::string& ckpt_dir, Model& m);

}  // namespace jtok
