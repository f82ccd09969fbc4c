// `jtok train --init-from CKPT`: a new run (fresh optimizer, step 0, its own run directory) that
// starts from a checkpoint's weights. The run's config may attach JTok / JTok-M to a backbone that
// had none: every tensor of the checkpoint is loaded by name, and the modules the checkpoint lacks
// (tables, scalers, routers) keep their fresh init, with their scalers s = 0 unless the user set
// jtok_scale_init / jtokm_scale_init: the upgraded model then computes the checkpoint's output at
// step 0, bit for bit (docs/jtok.md "Attaching tables").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "train/config.h"

namespace jtok {

struct InitFromPlan {
  std::string checkpoint;                    // the checkpoint directory the weights come from
  int64_t checkpoint_step = 0;               // its trainer_state.json step (0 if it has none)
  std::vector<int64_t> jtok_attached;        // layers whose JTok module the checkpoint lacks
  std::vector<int64_t> jtokm_attached;       // layers whose JTok-M module the checkpoint lacks
  bool jtok_scale_zeroed = false, jtokm_scale_zeroed = false;  // set to 0 by plan_init_from
  std::string describe() const;              // one line for the start-up output
};

// The config of an --init-from run given no --config: the checkpoint's own config.json (its model
// and training fields) with the overrides (--set, field flags such as --jtok true, --max-steps)
// applied, so a backbone is never restated by hand. An error names the checkpoint when it has no
// config.json.
Config init_from_config(const std::string& ckpt_dir, const std::vector<std::string>& overrides);

// Checks cfg against the checkpoint's config.json: every backbone field (all but jtok* and
// initializer_range) equal, and for a module the checkpoint already has, the fields that change its
// output (eps, norm, n_e, K, depth scaling) equal; an error names the field and both values. Then
// sets cfg.jtok_scale_init / jtokm_scale_init to 0 when modules are attached and the user did not
// set them (*_explicit).
InitFromPlan plan_init_from(const std::string& ckpt_dir, ModelConfig& cfg, bool jtok_scale_explicit,
                            bool jtokm_scale_explicit);

// Loads every tensor of ckpt_dir/model.safetensors into m (built with its random init) by name.
// Errors name the file and tensor: a shape or dtype that differs, a backbone tensor the file lacks,
// a tensor of the file the model has no place for. tables = false (embedding parallelism: the tables
// are sharded and initialised per rank): the file must hold no table. Returns the names kept fresh.
std::vector<std::string> load_init_weights(Model& m, const std::string& ckpt_dir, bool tables = true);

}  // namespace jtok
