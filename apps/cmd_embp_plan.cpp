// `jtok embp-plan`: exchange bytes of embedding parallelism at a given scale, from real token ids
// (dist/embp_plan.h; docs/distributed.md has the paper-scale table).
#include <cstdio>

#include "commands.h"
#include "core/error.h"
#include "data/loader.h"
#include "dist/embp_plan.h"
#include "train/config.h"

namespace cmd_embp_plan {

struct Args {
  std::string data, config;
  std::vector<std::string> sets;
  jtok::dist::PlanOptions o;
  bool json = false;
} args;

std::string gb(double bytes) {
  char buf[32];
  if (bytes >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  else std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  return buf;
}

// The text report of plan r for options o over `tokens` data tokens.
void print_plan(const nlohmann::json& r, const jtok::dist::PlanOptions& o, size_t tokens) {
  std::printf("embp-plan: %lld ranks | batch %lld x %lld (%.2fM tokens a step; data %s, %.2fM tokens%s) | micro-batch %lld row(s)\n",
              (long long)o.ranks, (long long)o.batch, (long long)o.seq, o.batch * o.seq / 1e6, args.data.c_str(),
              tokens / 1e6, tokens < static_cast<size_t>(o.batch * o.seq * o.steps) ? ", reused" : "",
              (long long)o.micro_batch);
  std::printf("model: d %lld | V %lld | JTok-M %lld layers, n_e %lld, top-%lld | JTok %lld layers | routing %s\n", (long long)o.d,
              (long long)o.vocab, (long long)o.jtokm_layers, (long long)o.n_e, (long long)o.K, (long long)o.jtok_layers,
              o.routing.c_str());
  std::printf("dedup: %.2f positions per unique id", r["dedup_positions_per_unique_id"].get<double>());
  if (r.contains("dedup_pair_ratio")) std::printf(", %.2f (position, k) per unique (id, table)", r["dedup_pair_ratio"].get<double>());
  std::printf("\ntable bytes per rank per step (sent + received, forward + backward, all layers):\n");
  const char* names[][2] = {{"replicated_dense", "replicated tables, dense gradient allreduce"},
                            {"replicated_rows", "replicated tables, row-list gradients"},
                            {"naive_nodedup", "EmbP naive, K rows per token"},
                            {"naive", "EmbP naive, unique (id, table) rows (--embp naive)"},
                            {"premix", "EmbP premix, d per token (--embp premix)"},
                            {"premix_dedup", "EmbP premix + dedup (--embp premix-dedup)"},
                            {"jtok_nodedup", "JTok EmbP, d per token"},
                            {"jtok", "JTok EmbP, unique ids"}};
  for (auto& n : names) {
    const auto& b = r["bytes_per_rank_per_step"][n[0]];
    if (b["max"].get<double>() == 0) continue;
    std::printf("  %-52s max %12s | mean %12s\n", n[1], gb(b["max"].get<double>()).c_str(), gb(b["mean"].get<double>()).c_str());
  }
  const auto& li = r["load_imbalance"];
  std::printf("owner load imbalance (max / mean rows served): id mod P: unique ids %.3f, positions %.3f | contiguous: unique ids %.3f, positions %.3f\n",
              li["mod"]["unique_ids"].get<double>(), li["mod"]["positions"].get<double>(),
              li["contiguous"]["unique_ids"].get<double>(), li["contiguous"]["positions"].get<double>());
}

void run() {
  using namespace jtok;
  Config cfg = load_config(args.config, args.sets);
  const dist::PlanOptions o = dist::plan_options_for_model(cfg.model, args.o);
  if (o.jtokm_layers == 0 && o.jtok_layers == 0) fail("embp-plan: config ", args.config, " has neither JTok nor JTok-M (--set jtokm=true)");
  LoaderOptions lo;
  lo.vocab_size = static_cast<uint32_t>(cfg.model.vocab_size);
  const std::vector<int32_t> tokens = read_all_tokens(ShardSet(list_shards(args.data), lo));
  nlohmann::json r = dist::embp_plan(tokens, o);
  r["data"] = args.data;
  r["data_tokens"] = tokens.size();
  if (args.json) {
    std::printf("%s\n", r.dump().c_str());
    return;
  }
  print_plan(r, o, tokens.size());
}

void setup(CLI::App* sub) {
  sub->add_option("--data", args.data, "token shard file or directory (real ids)")->required();
  sub->add_option("--config", args.config, "model config (d, vocabulary, JTok/JTok-M layers, n_e, top-K)")->required();
  sub->add_option("--set", args.sets, "override a config field: name=value (repeatable)");
  sub->add_option("--ranks", args.o.ranks, "P ranks")->required();
  sub->add_option("--seq", args.o.seq, "T tokens per row")->required();
  sub->add_option("--batch", args.o.batch, "B rows per global step")->required();
  sub->add_option("--micro-batch", args.o.micro_batch, "rows per exchange (deduplication unit) on each rank");
  sub->add_option("--steps", args.o.steps, "steps to average over");
  sub->add_option("--routing", args.o.routing, "JTok-M stand-in routing: random or per-id")->check(CLI::IsMember({"random", "per-id"}));
  sub->add_flag("--json", args.json, "print one JSON object");
  sub->callback(run);
}

const bool registered = jtok::register_command({"embp-plan", "exchange bytes of embedding parallelism at a given scale, from real token ids", setup});

}  // namespace cmd_embp_plan
