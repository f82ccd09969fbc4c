// `jtok eval`: validation loss and perplexity on shards, and BLiMP accuracy, of a checkpoint;
// with --reference, how far its next-token distributions are from another checkpoint's on the
// same validation positions (KL, top-1 agreement: a low-precision export against its fp32 source).
// --device cuda scores every mode through the GPU decoder (infer/decoder_scores.h), the reference
// still on the CPU's forward: the GPU is the side under test. --score-through-decoder (hidden) takes
// that path with the CPU decoder, so CI checks it against the CPU's forward (tests/test_eval_decoder.sh).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>

#include "commands.h"
#include "core/error.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "infer/blimp.h"
#include "infer/decoder.h"
#include "infer/decoder_scores.h"
#include "infer/logit_compare.h"
#include "infer/text_scores.h"
#include "infer/validation.h"
#include "model/transformer.h"
#include "model/weights_io.h"
#include "run_setup.h"
#include "train/checkpoint.h"

namespace cmd_eval {

struct Args {
  std::string checkpoint, val_data, reference, blimp_dir = "../shared/data/blimp", token_logprobs_file;
  jtok::TableSource table_src;
  jtok::DecoderChoice decoder;
  std::string kv_dtype = "auto";  // a decoder's KV cache (auto: bf16 with bf16 weights, else f32)
  int64_t max_prefill = 512;      // tokens a decoder's prefill call takes at most
  int64_t val_batches = 0, blimp_limit = 0, batch_size = 64;
  bool json = false, no_blimp = false, score_through_decoder = false;
} args;

// Where the checkpoint's logits come from: the CPU's forward (no decoder: the default, today's
// code), or a Decoder (--device cuda; the CPU decoder with --score-through-decoder).
struct Scoring {
  const jtok::Model& m;
  std::unique_ptr<jtok::Decoder> dec;
  int64_t piece = 0;
  jtok::DecoderScorer scorer() const { return {*dec, piece, m.cfg.vocab_size}; }
};

// The decoder's settings when the logits come from one (checked, and the GPU required, before any
// checkpoint is read); none for the CPU's forward, which refuses the decoder's options by name.
std::optional<jtok::cuda::DecoderSettings> decoder_settings() {
  const jtok::DecoderChoice& d = args.decoder;
  if (d.device == "cpu" && !args.score_through_decoder) {
    const jtok::DecoderChoice def;
    if (d.precision != def.precision || d.table_rows != def.table_rows || d.cuda_graphs != def.cuda_graphs ||
        d.int8_decode != def.int8_decode || d.pdl != def.pdl || d.tensor_cores != def.tensor_cores ||
        args.kv_dtype != "auto" || args.max_prefill != 512)
      jtok::fail(
          "eval: --precision, --kv-dtype, --table-rows, --cuda-graphs, --int8-decode, --pdl, --tensor-cores and "
          "--max-prefill are for a decoder (--device cuda)");
    return std::nullopt;
  }
  jtok::check_decoder_choice(d);  // --device cuda: the GPU, or why not
  if (args.max_prefill < 1) jtok::fail("eval: --max-prefill must be at least 1, got ", args.max_prefill);
  const bool bf16 = d.device == "cuda" && d.precision != "fp32";
  const std::string kv = args.kv_dtype == "auto" ? (bf16 ? "bf16" : "f32") : args.kv_dtype;
  jtok::cuda::DecoderSettings s =
      jtok::decoder_settings(d, jtok::parse_dtype(kv, "--kv-dtype", jtok::kKvDtypes) == jtok::Dtype::bf16);
  s.max_batch = 1;  // one sequence at a time
  s.max_prefill = args.max_prefill;
  return s;
}

// --token-logprobs FILE: the file's text scored as a BLiMP sentence, token by token.
nlohmann::json text_token_logprobs(const Scoring& sc, const jtok::Tokenizer& tok, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) jtok::fail("--token-logprobs: cannot read ", path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto ids = jtok::scored_text_ids(tok, {text}, sc.m.cfg.max_position_embeddings);
  const auto lps = sc.dec ? jtok::decoder_token_logprobs(sc.scorer(), ids) : jtok::sequence_token_logprobs(sc.m, ids, 1);
  nlohmann::json lp = nlohmann::json::array({nullptr});
  for (float v : lps[0]) lp.push_back(v);
  return {{"file", path}, {"tokens", ids[0]}, {"token_logprobs", lp}};
}

// --reference: the second checkpoint, refused unless its vocabulary and tokenizer are ck's.
std::optional<jtok::LoadedCheckpoint> load_reference(const jtok::LoadedCheckpoint& ck) {
  using namespace jtok;
  std::optional<LoadedCheckpoint> ref;
  if (args.reference.empty()) return ref;
  ref.emplace(load_for_inference(args.reference, args.table_src.kind == "mmap"));
  const ModelConfig &a = ck.cfg.model, &r = ref->cfg.model;
  if (a.vocab_size != r.vocab_size || a.padded_vocab() != r.padded_vocab() ||
      ck.tokenizer.fingerprint() != ref->tokenizer.fingerprint())
    fail("--reference ", ref->dir, ": vocabulary ", r.vocab_size, " (tokenizer ", ref->tokenizer.name(),
         ") does not match ", ck.dir, "'s ", a.vocab_size, " (", ck.tokenizer.name(), ")");
  return ref;
}

// out["reference"], printed unless --json.
void report_reference(nlohmann::json& out, const jtok::ValidationSums& s, const std::string& ref_dir, int64_t nb) {
  const jtok::LogitComparison& cmp = s.cmp;
  const double n = static_cast<double>(cmp.positions);
  out["reference"] = {{"checkpoint", ref_dir},
                      {"val_loss", s.ref_loss_sum / static_cast<double>(nb)},
                      {"positions", cmp.positions},
                      {"kl_mean", cmp.kl_sum / n},
                      {"kl_max", cmp.kl_max},
                      {"top1_agreement", static_cast<double>(cmp.top1_same) / n},
                      {"dlogp_mean", cmp.dlogp_sum / n},
                      {"dlogp_abs_mean", cmp.dlogp_abs_sum / n},
                      {"dlogp_abs_max", cmp.dlogp_abs_max}};
  if (!args.json)
    std::printf("against %s (loss %.4f): KL mean %.3e max %.3e | top-1 agreement %.2f %% | "
                "log p(target) change mean %+.3e, |mean| %.3e, |max| %.3e over %lld positions\n",
                ref_dir.c_str(), s.ref_loss_sum / static_cast<double>(nb), cmp.kl_sum / n, cmp.kl_max,
                100.0 * static_cast<double>(cmp.top1_same) / n, cmp.dlogp_sum / n, cmp.dlogp_abs_sum / n,
                cmp.dlogp_abs_max, static_cast<long long>(cmp.positions));
}

// out["token_logprobs"] for --token-logprobs, printed unless --json.
void report_token_logprobs(nlohmann::json& out, const Scoring& sc, const jtok::Tokenizer& tok) {
  out["token_logprobs"] = text_token_logprobs(sc, tok, args.token_logprobs_file);
  if (args.json) return;
  const auto& tl = out["token_logprobs"];
  std::printf("token log-probs of %s ([<|endoftext|>] + its tokens):\n", args.token_logprobs_file.c_str());
  for (size_t t = 0; t < tl["tokens"].size(); ++t)
    std::printf("  %6d %s\n", tl["tokens"][t].get<int>(), tl["token_logprobs"][t].dump().c_str());
}

// The BLiMP table: ours beside the published models' accuracies (blank where res has none).
void print_blimp(const nlohmann::json& res) {
  auto ref = [&](const char* model, const std::string& key, const std::string& name) -> std::string {
    if (!res.contains("reference") || !res["reference"].contains(model)) return "";
    auto& r = res["reference"][model];
    const nlohmann::json* v = key.empty() ? (r.contains("accuracy") ? &r["accuracy"] : nullptr)
                                          : (r.contains(key) && r[key].contains(name) ? &r[key][name] : nullptr);
    char b[16];
    std::snprintf(b, sizeof b, "%6.1f", v ? 100 * v->get<double>() : NAN);
    return b;
  };
  std::printf("BLiMP (%lld pairs; simple LM method)       ours  5-gram   LSTM  TrXL  GPT-2\n",
              static_cast<long long>(res["pairs"].get<int64_t>()));
  std::printf("  %-38s %6.1f %s %s %s %s\n", "overall (mean over paradigms)", 100 * res["accuracy_paradigm_mean"].get<double>(),
              ref("ngram", "", "").c_str(), ref("lstm", "", "").c_str(), ref("txl", "", "").c_str(), ref("gpt2", "", "").c_str());
  for (auto& [term, a] : res["by_term"].items())
    std::printf("  %-38s %6.1f %s %s %s %s\n", term.c_str(), 100 * a.get<double>(), ref("ngram", "by_term", term).c_str(),
                ref("lstm", "by_term", term).c_str(), ref("txl", "by_term", term).c_str(), ref("gpt2", "by_term", term).c_str());
  for (auto& [field, a] : res["by_field"].items())
    std::printf("  field %-32s %6.1f\n", field.c_str(), 100 * a.get<double>());
  std::printf("  (per-paradigm figures: --json)\n");
}

// The decoder the logits come from (settings given), said on stdout (out["decoder"]); none without.
Scoring make_scoring(const jtok::Model& m, const std::optional<jtok::cuda::DecoderSettings>& settings,
                     nlohmann::json& out) {
  Scoring sc{m, nullptr, 0};
  if (!settings) return sc;
  sc.dec = jtok::make_decoder(m, args.decoder.device, *settings);
  sc.piece = settings->max_prefill;
  out["decoder"] = sc.dec->describe();
  if (!args.json) std::printf("scored through the decoder: %s\n", sc.dec->describe().c_str());
  return sc;
}

void run() {
  using namespace jtok;
  resolve_hbm_tables(args.table_src, args.decoder);
  const std::optional<cuda::DecoderSettings> settings = decoder_settings();  // before the checkpoint is read
  LoadedCheckpoint ck = load_for_inference(args.checkpoint, args.table_src, args.decoder.device == "cpu");
  const Config& cfg = ck.cfg;
  const Model& m = ck.model;
  const Tokenizer& tok = ck.tokenizer;
  nlohmann::json out = {{"checkpoint", ck.dir}};
  const Scoring sc = make_scoring(m, settings, out);
  auto t0 = std::chrono::steady_clock::now();

  const std::string val_path = args.val_data.empty() ? cfg.train.val_data : args.val_data;
  LoaderOptions lo;
  lo.vocab_size = static_cast<uint32_t>(cfg.model.vocab_size);
  lo.tokenizer = tok.name();
  lo.tokenizer_fingerprint = tok.fingerprint();
  ValidationSet val(list_shards(val_path), lo, static_cast<int>(cfg.train.micro_batch_size), static_cast<int>(cfg.train.seq_len));
  int64_t nb = static_cast<int64_t>(val.num_batches());
  if (args.val_batches > 0) nb = std::min(nb, args.val_batches);
  if (nb == 0) fail("validation data ", val_path, " is shorter than one batch");
  const std::optional<LoadedCheckpoint> ref = load_reference(ck);
  const Model* ref_model = ref ? &ref->model : nullptr;
  const ValidationSums s = sc.dec ? decoder_validation_sums(sc.scorer(), ref_model, val, nb)
                                  : validation_sums(m, ref_model, val, nb);
  const double vl = s.loss_sum / static_cast<double>(nb);
  out["val_loss"] = vl;
  out["val_ppl"] = std::exp(vl);
  out["val_tokens"] = nb * cfg.train.micro_batch_size * cfg.train.seq_len;
  if (!args.json)
    std::printf("validation: loss %.4f | ppl %.2f | %lld tokens of %s\n", vl, std::exp(vl),
                static_cast<long long>(out["val_tokens"].get<int64_t>()), val_path.c_str());
  if (ref) report_reference(out, s, ref->dir, nb);
  if (!args.token_logprobs_file.empty()) report_token_logprobs(out, sc, tok);
  if (!args.no_blimp) {
    auto score = [&](const std::vector<std::string>& ss) {
      return sc.dec ? decoder_score_texts(sc.scorer(), tok, ss, m.cfg.max_position_embeddings)
                    : score_texts(m, tok, ss, args.batch_size);
    };
    auto res = evaluate_blimp(load_blimp(args.blimp_dir, args.blimp_limit), score, args.blimp_dir);
    out["blimp"] = res;
    if (!args.json) print_blimp(res);
  }
  out["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (args.json) std::printf("%s\n", out.dump().c_str());
}

void setup(CLI::App* sub) {
  sub->add_option("--checkpoint", args.checkpoint, "checkpoint directory, or a run directory (its newest)")->required();
  add_table_source_options(sub, args.table_src);
  sub->add_option("--val-data", args.val_data, "validation shards (default: the config's val_data)");
  sub->add_option("--val-batches", args.val_batches, "at most this many validation batches (0 = all)");
  sub->add_option("--reference", args.reference,
                  "a second checkpoint (e.g. the fp32 source of an export): KL, top-1 agreement and log-prob "
                  "change of this checkpoint's next-token distributions against it, on the validation positions "
                  "(always on the CPU's forward: with --device cuda the GPU is the side under test)");
  sub->add_option("--blimp", args.blimp_dir, "BLiMP data directory");
  sub->add_option("--blimp-limit", args.blimp_limit, "at most this many pairs per paradigm (0 = all 1,000)");
  sub->add_option("--batch-size", args.batch_size, "sentences per forward pass for BLiMP (a decoder takes one at a time)");
  sub->add_flag("--no-blimp", args.no_blimp, "validation loss only");
  sub->add_option("--token-logprobs", args.token_logprobs_file,
                  "also score FILE's text as BLiMP scores a sentence ([<|endoftext|>] + its tokens): every token's "
                  "log p(token | prefix), the first null (JSON: token_logprobs {tokens, token_logprobs})");
  sub->add_flag("--json", args.json, "print one JSON object (val_loss, val_ppl, blimp, reference)");
  add_decoder_options(sub, args.decoder);
  sub->add_option("--kv-dtype", args.kv_dtype, "a decoder's KV cache: f32 or bf16 (default: bf16 with bf16 weights, else f32)");
  sub->add_option("--max-prefill", args.max_prefill,
                  "tokens one decoder prefill call takes at most; longer sequences go in pieces (default 512)");
  // Hidden: the decoder path on the CPU decoder (--device cpu), CI's check of --device cuda's scoring.
  sub->add_flag("--score-through-decoder", args.score_through_decoder,
                "score through the CPU decoder (KV cache, prefill in pieces) instead of the forward pass")
      ->group("");
  sub->callback(run);
}

const bool registered = jtok::register_command({"eval", "validation loss/perplexity and BLiMP accuracy of a checkpoint", setup});

}  // namespace cmd_eval
