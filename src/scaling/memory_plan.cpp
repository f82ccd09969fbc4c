#include "scaling/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <tuple>

#include "model/activation_bytes.h"
#include "model/inference_model.h"
#include "model/trainable.h"
#include "model/transformer.h"

namespace jtok {

MemoryPlan memory_plan(const Config& cfg, int64_t B, int64_t T, int64_t table_ranks) {
  const ModelConfig& c = cfg.model;
  const int64_t f = 4, d = c.hidden_size, Vp = c.padded_vocab();
  MemoryPlan p;
  int64_t flat = 0, trainable = 0;
  for (const ParamInfo& q : param_layout(c)) {
    flat += q.numel;
    if (cfg.train.train_only != "tables" || is_token_indexed_param(q.name)) trainable += q.numel;
  }
  const int64_t n_tables = token_table_count(c);
  const int64_t ranks = std::max<int64_t>(1, table_ranks);
  const int64_t table_numel = n_tables * Vp * d / ranks;
  p.weights = f * flat;
  p.tables = f * table_numel;
  p.moments_backbone = 2 * f * trainable;
  p.moments_tables = 2 * f * table_numel;
  // Row-sparse table gradients: per table a slot per row (int32) and a row per distinct id of the step.
  const int64_t ids = std::min(Vp, B * T * cfg.train.gradient_accumulation_steps);
  p.gradients = f * flat + n_tables * (4 * Vp + f * ids * d);
  p.activations = activation_bytes(c, B, T).total();
  p.checkpoint = p.weights + p.tables + 2 * (p.moments_backbone + p.moments_tables);
  return p;
}

MemoryPlan device_memory_plan(const Config& cfg, int64_t B, int64_t T) {
  const MemoryPlan host = memory_plan(cfg, B, T);
  const ModelConfig& c = cfg.model;
  const bool bf16 = cfg.train.precision == "bf16";
  // The token tables' rows, and an untied embedding's (its gradient row-sparse, stepped as a table's).
  const int64_t rows = (token_table_count(c) + (c.tie_word_embeddings ? 0 : 1)) * c.padded_vocab();
  MemoryPlan p;
  p.weights = host.weights + (bf16 ? host.weights / 2 : 0);
  p.tables = host.tables + (bf16 ? host.tables / 2 : 0);
  p.moments_backbone = 2 * host.weights;  // the device keeps every flat tensor's moments, frozen ones too
  p.moments_tables = host.moments_tables;
  p.gradients = host.weights + host.tables + rows * (1 + 4 + 4);  // + touched flag, row list, row step
  p.activations = host.activations;
  p.workspaces = 2 * (int64_t{32} << 20);
  return p;
}

MemoryPlan host_plan_of_device_run(const Config& cfg, int64_t B, int64_t T) {
  MemoryPlan p = memory_plan(cfg, B, T);
  p.activations = 0;
  return p;
}

nlohmann::json to_json(const MemoryPlan& p) {
  return {{"weights", p.weights},   {"tables", p.tables},       {"moments_backbone", p.moments_backbone},
          {"moments_tables", p.moments_tables}, {"gradients", p.gradients}, {"activations", p.activations},
          {"workspaces", p.workspaces}, {"steady", p.steady()}, {"checkpoint_write", p.checkpoint},
          {"total", p.total()}};
}

std::string memory_plan_text(const MemoryPlan& p, const std::string& indent) {
  auto gib = [](int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); };
  const bool gpu = p.workspaces > 0;  // cuBLASLt's workspaces: a row only in a GPU plan
  const std::tuple<const char*, int64_t, bool> rows[] = {
      {"weights (flat parameters)  ", p.weights, true},   {"token-indexed tables       ", p.tables, true},
      {"AdamW moments, flat        ", p.moments_backbone, true},
      {"AdamW moments, tables      ", p.moments_tables, true},
      {"gradients                  ", p.gradients, true}, {"activations (micro-batch)  ", p.activations, true},
      {"cuBLASLt workspaces        ", p.workspaces, gpu}, {"= while training           ", p.steady(), true},
      {"+ checkpoint write copies  ", p.checkpoint, true}, {"= peak                     ", p.total(), true}};
  std::ostringstream os;
  char buf[128];
  for (const auto& [name, b, shown] : rows) {
    if (!shown) continue;
    std::snprintf(buf, sizeof buf, "%s%s %12.3f GiB\n", indent.c_str(), name, gib(b));
    os << buf;
  }
  return os.str();
}

int64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

std::string memory_plan_refusal(const MemoryPlan& p, const Config& cfg, int64_t available) {
  if (available < 0 || p.total() <= available) return "";
  auto gib = [](int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); };
  char buf[256];
  std::snprintf(buf, sizeof buf, "the training plan needs %.2f GiB but %.2f GiB are available (MemAvailable)", gib(p.total()),
                gib(available));
  std::string msg = buf;
  const int64_t table_part = p.tables + p.moments_tables;
  if (table_part > 0) {
    std::snprintf(buf, sizeof buf, "; the tables and their AdamW moments take %.2f GiB: put tables on fewer layers "
                  "(jtok_layers, jtokm_layers, jtokm_n_e) or shard them over ranks (mpirun -np P jtok train --embp "
                  "premix-dedup; no bf16 table moments exist yet)", gib(table_part));
    msg += buf;
  }
  if (cfg.train.train_only != "tables" && p.moments_backbone > 0 && (cfg.model.jtok || cfg.model.jtokm)) {
    std::snprintf(buf, sizeof buf, "; --train-only tables drops the backbone's AdamW moments (%.2f GiB)", gib(p.moments_backbone));
    msg += buf;
  }
  std::snprintf(buf, sizeof buf, "; activations take %.2f GiB: a smaller micro_batch_size (with "
                "gradient_accumulation_steps) or seq_len shrinks them", gib(p.activations));
  msg += buf;
  if (p.checkpoint > 0) {  // none with --no-checkpoints
    std::snprintf(buf, sizeof buf, "; writing a checkpoint adds %.2f GiB of in-memory copies (weights, tables, "
                  "twice the moments), which shrink with them", gib(p.checkpoint));
    msg += buf;
  }
  return msg;
}

}  // namespace jtok
