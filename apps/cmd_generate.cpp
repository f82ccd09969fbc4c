// `jtok generate`: KV-cache decoding from a checkpoint on the CPU or the GPU (--device), tokens
// streamed as they come.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "infer/decoder.h"
#include "infer/generate.h"
#include "infer/generate_run.h"
#include "infer/prefetch.h"
#include "model/transformer.h"
#include "run_setup.h"
#include "train/checkpoint.h"

namespace cmd_generate {

struct Args {
  std::string checkpoint, prompt, ids_out;
  std::string kv_dtype = "f32";
  jtok::TableSource table_src;
  jtok::DecoderChoice decoder;
  int64_t max_new_tokens = 64, top_k = 40;
  double temperature = 0.8, top_p = 0.95;
  uint64_t seed = 1;
  bool stop_at_eot = true, prompt_logprobs = false;
} args;

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

// The prompt's ids: Llama 3's <|begin_of_text|> first, as HF; an empty prompt starts after a document break.
std::vector<int32_t> prompt_ids(const jtok::Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> prompt = tok.encode_with_bos(text);
  if (prompt.empty()) prompt.push_back(tok.eot_id());
  return prompt;
}

// --ids-out: the prompt and generated ids, the speeds, the margins, the device (and the prompt's
// log-probs, from the prefill's logits of every position).
void write_ids(const std::vector<int32_t>& prompt, const jtok::GenerateResult& r, const std::string& device_line) {
  const double n = static_cast<double>(r.generated.size());
  nlohmann::json j = {{"prompt_ids", prompt},
                      {"generated_ids", r.generated},
                      {"prefill_tok_s", prompt.size() / r.prefill_s},
                      {"decode_tok_s", n / r.decode_s},
                      {"top2_margins", r.top2_margins},
                      {"device", args.decoder.device},
                      {"decoder", device_line}};
  if (args.prompt_logprobs) j["prompt_logprobs"] = r.prompt_logprobs;
  std::ofstream f(args.ids_out);
  if (!(f << j.dump() << "\n")) jtok::fail("cannot write ", args.ids_out);
}

// The decoder of m for this command: one sequence of `capacity` positions on the GPU.
std::unique_ptr<jtok::Decoder> make_generate_decoder(const jtok::Model& m, bool kv_bf16, int64_t prompt_size,
                                                     int64_t capacity) {
  jtok::cuda::DecoderSettings s = jtok::decoder_settings(args.decoder, kv_bf16);
  s.max_batch = 1;
  s.max_prefill = std::min<int64_t>(prompt_size, 512);  // longer prompts: in pieces of 512
  s.kv_tokens = capacity;
  return jtok::make_decoder(m, args.decoder.device, s);
}

void run() {
  using namespace jtok;
  const bool kv_bf16 = parse_dtype(args.kv_dtype, "--kv-dtype", kKvDtypes) == Dtype::bf16;  // before the checkpoint loads
  resolve_hbm_tables(args.table_src, args.decoder);
  check_decoder_choice(args.decoder);  // --device cuda: the GPU, or why not, before anything is read
  LoadedCheckpoint ck = load_for_inference(args.checkpoint, args.table_src, args.decoder.device == "cpu");
  const Model& m = ck.model;
  const Tokenizer& tok = ck.tokenizer;
  const std::vector<int32_t> prompt = prompt_ids(tok, args.prompt);
  const int64_t capacity = std::min<int64_t>(ck.cfg.model.max_position_embeddings,
                                             static_cast<int64_t>(prompt.size()) + args.max_new_tokens);
  const std::unique_ptr<Decoder> decoder =
      make_generate_decoder(m, kv_bf16, static_cast<int64_t>(prompt.size()), capacity);
  GenerateOptions opt;
  opt.max_new_tokens = args.max_new_tokens;
  opt.sampling = SamplingParams{args.temperature, args.top_k, args.top_p};
  opt.seed = args.seed;
  opt.kv_bf16 = kv_bf16;
  opt.prompt_logprobs = args.prompt_logprobs && !args.ids_out.empty();
  if (args.stop_at_eot) opt.stop_ids = ck.eos_ids;
  std::printf("%s", args.prompt.c_str());
  std::fflush(stdout);
  const GenerateResult r = generate_tokens(m, *decoder, prompt, capacity, opt, [&](int32_t next) {
    std::string piece = tok.decode({next});  // raw bytes: a split UTF-8 character completes on the next token
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  const int64_t produced = static_cast<int64_t>(r.generated.size());
  const std::string store = store_summary(m);
  std::fprintf(stderr, "\n[prefill %zu tokens: %.1f tok/s | decode %lld tokens: %.1f tok/s | device %s%s]\n",
               prompt.size(), prompt.size() / r.prefill_s, static_cast<long long>(produced), produced / r.decode_s,
               decoder->describe().c_str(), store.c_str());
  if (!args.ids_out.empty()) write_ids(prompt, r, decoder->describe());
}

void setup(CLI::App* sub) {
  sub->add_option("--checkpoint", args.checkpoint, "checkpoint directory, or a run directory (its newest)")->required();
  add_table_source_options(sub, args.table_src);
  add_decoder_options(sub, args.decoder);
  sub->add_option("--prompt", args.prompt, "prompt text")->required();
  sub->add_option("--kv-dtype", args.kv_dtype,
                  "KV cache: f32 (exact) or bf16 (half the bytes a decoding step reads; values rounded to bf16); "
                  "--device cuda: the KV pages' dtype");
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

}  // namespace cmd_generate
