#include "train/init_from.h"

#include <filesystem>
#include <set>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_int.h"
#include "io/safetensors.h"
#include "model/trainable.h"
#include "model/weights_io.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;

namespace jtok {

namespace {

// Fields of a module the checkpoint already has that change its output: they must stay.
bool output_field_of_present_module(const std::string& name, const ModelConfig& ck) {
  static const std::set<std::string> jtok = {"jtok_eps", "jtok_norm"};
  static const std::set<std::string> jtokm = {"jtokm_n_e", "jtokm_top_k", "jtokm_eps", "jtokm_norm",
                                              "jtokm_depth_scaling"};
  return (ck.jtok && jtok.count(name)) || (ck.jtokm && jtokm.count(name));
}

bool backbone_field(const std::string& name) {
  return name.rfind("jtok", 0) != 0 && name != "initializer_range";  // the latter only sets fresh inits
}

std::string layer_list(const std::vector<int64_t>& ls) {
  std::ostringstream os;
  for (size_t i = 0; i < ls.size(); ++i) os << (i ? "," : "") << ls[i];
  return os.str();
}

}  // namespace

std::string InitFromPlan::describe() const {
  std::ostringstream os;
  os << "init-from: " << checkpoint << " (step " << checkpoint_step << "): every tensor of it loaded by name";
  if (!jtok_attached.empty())
    os << "; JTok attached on layers " << layer_list(jtok_attached)
       << (jtok_scale_zeroed ? " with s = 0 (jtok_scale_init 0)" : " (jtok_scale_init as set)");
  if (!jtokm_attached.empty())
    os << "; JTok-M attached on layers " << layer_list(jtokm_attached)
       << (jtokm_scale_zeroed ? " with s = 0 (jtokm_scale_init 0)" : " (jtokm_scale_init as set)");
  if (jtok_scale_zeroed || jtokm_scale_zeroed)
    os << ": at step 0 the model computes the checkpoint's output exactly";
  return os.str();
}

Config init_from_config(const std::string& ckpt_dir, const std::vector<std::string>& overrides) {
  const std::string path = (fs::path(ckpt_dir) / "config.json").string();
  if (!fs::exists(path)) fail("--init-from ", ckpt_dir, ": no config.json to start the run's config from; give --config");
  return load_config(path, overrides);
}

InitFromPlan plan_init_from(const std::string& ckpt_dir, ModelConfig& cfg, bool jtok_scale_explicit,
                            bool jtokm_scale_explicit) {
  InitFromPlan plan;
  plan.checkpoint = ckpt_dir;
  if (!fs::exists(fs::path(ckpt_dir) / "COMPLETE"))
    fail("--init-from ", ckpt_dir, ": the checkpoint is incomplete (no COMPLETE marker)");
  if (fs::exists(fs::path(ckpt_dir) / "table_store.json"))  // its tables would silently start from random values
    fail("--init-from ", ckpt_dir, ": the checkpoint keeps its token tables in a training table store (trained with --tables ",
         "disk; table_store.json names it), not in model.safetensors; continue that run with --resume --tables disk ",
         "--table-store DIR instead");
  const Config ck = load_checkpoint_config(ckpt_dir);
  try {  // informative only: an imported model's checkpoint is at step 0
    const auto st = nlohmann::json::parse(read_file((fs::path(ckpt_dir) / "trainer_state.json").string()));
    plan.checkpoint_step = json_int64(st.at("step")).value_or(0);
  } catch (const std::exception&) {
    plan.checkpoint_step = 0;
  }
  for (const FieldDiff& d : model_fields_differing(ck.model, cfg))
    if (backbone_field(d.name) || output_field_of_present_module(d.name, ck.model))
      fail("--init-from ", ckpt_dir, ": field ", d.name, " is ", d.a, " in the checkpoint's config.json but ", d.b,
           " in this run's config; ", backbone_field(d.name) ? "the backbone" : "a module the checkpoint has",
           " must stay as it was (change only jtok / jtokm fields)");
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    if (cfg.jtok_on_layer(l) && !ck.model.jtok_on_layer(l)) plan.jtok_attached.push_back(l);
    if (cfg.jtokm_on_layer(l) && !ck.model.jtokm_on_layer(l)) plan.jtokm_attached.push_back(l);
  }
  if (!plan.jtok_attached.empty() && !jtok_scale_explicit) {
    cfg.jtok_scale_init = 0.0;
    plan.jtok_scale_zeroed = true;
  }
  if (!plan.jtokm_attached.empty() && !jtokm_scale_explicit) {
    cfg.jtokm_scale_init = 0.0;
    plan.jtokm_scale_zeroed = true;
  }
  return plan;
}

std::vector<std::string> load_init_weights(Model& m, const std::string& ckpt_dir, bool tables) {
  const std::string path = (fs::path(ckpt_dir) / "model.safetensors").string();
  if (!fs::exists(path)) fail("--init-from ", ckpt_dir, ": no model.safetensors");
  const StIndex f = read_safetensors_index(path);
  std::set<std::string> placed;
  std::vector<std::string> fresh;
  for (const ParamInfo& p : m.layout) {
    placed.insert(p.name);
    if (f.tensors.count(p.name)) read_tensor_f32(f, p.name, p.shape, m.params.data() + p.offset);
    else if (is_token_indexed_param(p.name)) fresh.push_back(p.name);
    else fail(path, ": backbone tensor ", p.name, " is missing (the checkpoint is not of this backbone?)");
  }
  for (size_t k = 0; k < m.tables.size(); ++k) {
    const std::string& name = m.table_names[k];
    placed.insert(name);
    if (!f.tensors.count(name)) {
      fresh.push_back(name);
      continue;
    }
    if (!tables) fail(path, ": holds token table ", name, "; --init-from with --embp attaches new tables only");
    TokenTable& t = m.tables[k];
    const Dtype dt = table_dtype_in_file(f, name, t.rows, t.dim);
    if (dt != Dtype::f32)
      fail(path, ": token table ", name, " is ", dtype_name(dt), " (an inference export); training needs f32 tables");
    read_tensor_bytes(f, name, t.mutable_data());
  }
  for (const auto& [name, e] : f.tensors)
    if (!placed.count(name))
      fail(path, ": tensor ", name, " has no place in this run's model (its config drops a module or layer the "
           "checkpoint has?)");
  return fresh;
}

}  // namespace jtok
