// `jtok generate`: KV-cache decoding from a checkpoint, tokens streamed as they come.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <random>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "infer/generate.h"
#include "infer/prefetch.h"
#include "model/transformer.h"
#include "run_setup.h"
#include "train/checkpoint.h"

namespace {

struct Args {
  std::string checkpoint, prompt, ids_out;
  std::string kv_dtype = "f32";
  jtok::TableSource table_src;
  int64_t max_new_tokens = 64, top_k = 40;
  double temperature = 0.8, top_p = 0.95;
  uint64_t seed = 1;
  bool stop_at_eot = true, prompt_logprobs = false;
} args;

// Logit of the best token minus that of the second best: how close greedy decoding was to a tie.
double top2_margin(const std::vector<float>& logits) {
  float a = -std::numeric_limits<float>::infinity(), b = a;
  for (float x : logits) {
    if (x > a) { b = a; a = x; }
    else if (x > b) b = x;
  }
  return static_cast<double>(a) - b;
}

// Disk tables: " | table store: ..." (the store's cache and reads) for the summary line; "" otherwise.
std::string store_summary(const jtok::Model& m) {
  const auto st = jtok::disk_table_stats(m);
  if (!st) return "";
  char b[256];
  std::snprintf(b, sizeof b, " | table store: %lld hits, %lld waits, %lld misses, %lld reads (%lld read ahead), %.2f MB, mean read %.1f us",
                static_cast<long long>(st->hits), static_cast<long long>(st->waits), static_cast<long long>(st->misses),
                static_cast<long long>(st->reads), static_cast<long long>(st->prefetch_reads),
                static_cast<double>(st->bytes_read) / 1e6, st->reads ? static_cast<double>(st->read_ns) / st->reads / 1e3 : 0.0);
  return b;
}

void run() {
  using namespace jtok;
  parse_dtype(args.kv_dtype, "--kv-dtype", kKvDtypes);  // a bad value fails before the checkpoint loads
  LoadedCheckpoint ck = load_for_inference(args.checkpoint, args.table_src);
  const Config& cfg = ck.cfg;
  const Model& m = ck.model;
  const Tokenizer& tok = ck.tokenizer;
  std::vector<int32_t> prompt = tok.encode_with_bos(args.prompt);  // Llama 3: <|begin_of_text|> first, as HF
  if (prompt.empty()) prompt.push_back(tok.eot_id());  // unconditional: start after a document break
  const int64_t capacity = std::min<int64_t>(cfg.model.max_position_embeddings,
                                             static_cast<int64_t>(prompt.size()) + args.max_new_tokens);
  std::mt19937_64 rng(args.seed);
  SamplingParams sp{args.temperature, args.top_k, args.top_p};
  std::printf("%s", args.prompt.c_str());
  std::fflush(stdout);
  auto t0 = std::chrono::steady_clock::now();
  KVCache cache;
  cache.bf16 = parse_dtype(args.kv_dtype, "--kv-dtype", kKvDtypes) == Dtype::bf16;
  prefetch_disk_rows(m, prompt.data(), static_cast<int64_t>(prompt.size()));  // disk tables: read from now on
  std::vector<float> logits = prefill(m, cache, prompt, capacity);
  const double prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto t1 = std::chrono::steady_clock::now();
  int64_t produced = 0;
  std::vector<int32_t> generated;
  std::vector<double> margins;
  while (produced < args.max_new_tokens) {
    int32_t next = sample_token(logits, sp, rng);
    if (produced + 1 < args.max_new_tokens) prefetch_disk_rows(m, &next, 1);  // read during the output and first layers
    margins.push_back(top2_margin(logits));
    ++produced;
    generated.push_back(next);
    if (args.stop_at_eot && std::find(ck.eos_ids.begin(), ck.eos_ids.end(), next) != ck.eos_ids.end()) break;
    std::string piece = tok.decode({next});  // raw bytes: a split UTF-8 character completes on the next token
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (cache.len >= cache.capacity) break;
    logits = decode_step(m, cache, next);
  }
  const double decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  const std::string store = store_summary(m);
  std::fprintf(stderr, "\n[prefill %zu tokens: %.1f tok/s | decode %lld tokens: %.1f tok/s%s]\n", prompt.size(),
               prompt.size() / prefill_s, static_cast<long long>(produced), produced / decode_s, store.c_str());
  if (!args.ids_out.empty()) {
    nlohmann::json j = {{"prompt_ids", prompt},
                        {"generated_ids", generated},
                        {"prefill_tok_s", prompt.size() / prefill_s},
                        {"decode_tok_s", produced / decode_s},
                        {"top2_margins", margins}};
    if (args.prompt_logprobs) {
      // log p(prompt[t] | prompt[<t]) for t >= 1, from one full forward over the prompt.
      const int64_t T = static_cast<int64_t>(prompt.size());
      Activations acts;
      forward(m, acts, prompt.data(), 1, T);
      std::vector<int32_t> targets(prompt.begin() + 1, prompt.end());
      targets.push_back(0);  // the last position's target is not reported
      std::vector<float> lp(static_cast<size_t>(T));
      token_logprobs(m, acts, targets.data(), lp.data());
      lp.pop_back();
      j["prompt_logprobs"] = lp;
    }
    std::ofstream f(args.ids_out);
    if (!(f << j.dump() << "\n")) fail("cannot write ", args.ids_out);
  }
}

void setup(CLI::App* sub) {
  sub->add_option("--checkpoint", args.checkpoint, "checkpoint directory, or a run directory (its newest)")->required();
  add_table_source_options(sub, args.table_src);
  sub->add_option("--prompt", args.prompt, "prompt text")->required();
  sub->add_option("--kv-dtype", args.kv_dtype,
                  "KV cache: f32 (exact) or bf16 (half the bytes a decoding step reads; values rounded to bf16)");
  sub->add_option("--max-new-tokens", args.max_new_tokens, "tokens to generate");
  sub->add_option("--temperature", args.temperature, "0 = greedy");
  sub->add_option("--top-k", args.top_k, "keep the k most likely tokens (0 = all)");
  sub->add_option("--top-p", args.top_p, "nucleus: smallest set with this probability (1 = all)");
  sub->add_option("--seed", args.seed, "sampling seed");
  sub->add_option("--ids-out", args.ids_out, "write the prompt and generated token ids and the tok/s as JSON here");
  sub->add_flag("--prompt-logprobs", args.prompt_logprobs,
                "with --ids-out: also write log p(prompt[t] | prompt[<t]) of every prompt token after the first");
  sub->add_flag("!--no-stop", args.stop_at_eot,
                "do not stop at an end-of-sequence token (<|endoftext|>, or an imported model's eos ids)");
  sub->callback(run);
}

const bool registered = jtok::register_command({"generate", "generate text from a checkpoint with a KV cache", setup});

}  // namespace
