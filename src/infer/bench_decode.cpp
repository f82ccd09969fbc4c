#include "infer/bench_decode.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/parallel.h"
#include "cuda/decoder_sizes.h"
#include "cuda/device.h"
#include "cuda/kernel_trace.h"
#include "cuda/kernel_trace_file.h"
#include "data/loader.h"
#include "data/shard.h"
#include "infer/decoder.h"

namespace jtok {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string hex64(uint64_t h) {
  char s[17];
  std::snprintf(s, sizeof s, "%016" PRIx64, h);
  return s;
}

double peak_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss: KiB on Linux
}

// The process's peak RSS, and on a GPU the peak device memory since this mode's decoder was made
// (bench_decode resets it between modes, so an hbm decoder's device tables do not show in the next
// mode's lines; HF's peak_gpu_mb, max_memory_allocated, counts the same way).
void add_peak_memory(nlohmann::json& j, const std::string& device) {
  j["peak_rss_mb"] = peak_rss_mb();
  if (device == "cuda") j["peak_gpu_mb"] = static_cast<double>(cuda::device_bytes_peak()) / (1024.0 * 1024.0);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// The mean of the profiled decode steps' breakdowns (a GPU decoder with JTOK_PROFILE=1), per field.
struct StepMeans {
  static constexpr std::pair<const char*, double cuda::StepBreakdown::*> kFields[] = {
      {"embed", &cuda::StepBreakdown::embed_ms},
      {"attention", &cuda::StepBreakdown::attention_ms},
      {"rows_wait", &cuda::StepBreakdown::rows_wait_ms},
      {"mlp", &cuda::StepBreakdown::mlp_ms},
      {"head", &cuda::StepBreakdown::head_ms},
      {"digest", &cuda::StepBreakdown::digest_ms},
      {"logits_copy", &cuda::StepBreakdown::logits_copy_ms},
      {"step", &cuda::StepBreakdown::step_ms},
      {"rows_dedup", &cuda::StepBreakdown::rows_dedup_ms},
      {"rows_gather", &cuda::StepBreakdown::rows_gather_ms},
      {"rows_issue", &cuda::StepBreakdown::rows_issue_ms},
      {"host", &cuda::StepBreakdown::host_ms}};
  cuda::StepBreakdown sum;
  int64_t steps = 0, rows = 0, max_len = 0;  // the last step's rows and attention length

  void add(const cuda::StepBreakdown& b) {
    if (!b.valid) return;
    for (const auto& [name, field] : kFields) sum.*field += b.*field;
    ++steps;
    rows = b.rows;
    max_len = b.max_len;
  }
  double mean(double cuda::StepBreakdown::*field) const { return sum.*field / static_cast<double>(steps); }
  // {"steps", "rows", "max_len", then each field's mean in ms}.
  nlohmann::json json() const {
    nlohmann::json j = {{"steps", steps}, {"rows", rows}, {"max_len", max_len}};
    for (const auto& [name, field] : kFields) j[std::string(name) + "_ms"] = mean(field);
    return j;
  }
  std::string line() const {
    std::string out = "step breakdown, mean of " + std::to_string(steps) + " steps (ms):";
    char buf[64];
    for (const auto& [name, field] : kFields) {
      std::snprintf(buf, sizeof buf, " %s %.4f", name, mean(field));
      out += buf;
    }
    return out;
  }
};

// One timed run's figures.
struct RunTimes {
  double prefill_s = 0, decode_s = 0, sample_s = 0;
  int64_t rows = 0;                // token-table rows the decode steps read
  std::vector<int32_t> generated;  // (M, N + 1): the prefill's token, then each step's
  cuda::KernelTraceFile trace;     // the run's decode steps or prefill, where a trace was asked for
};

// Where a run's kernel trace goes ("": none) and whether its decoder is a GPU's.
struct TraceAsk {
  std::string path;
  bool cuda = false;
};

// M sequences of prompts (M, P) prefilled one after another, then N decode steps of all M (each
// step's breakdown added to `means` where the decoder profiles).
RunTimes decode_run(Decoder& dec, const int32_t* prompts, int64_t M, int64_t P, int64_t N, int64_t V,
                    StepMeans* means = nullptr, const TraceAsk& trace = {}) {
  RunTimes t;
  std::vector<int64_t> seqs(static_cast<size_t>(M));
  std::vector<int32_t> tok(static_cast<size_t>(M));
  const std::vector<PickRequest> greedy(static_cast<size_t>(M), PickRequest{{.temperature = 0}, nullptr, -1});
  std::vector<TokenPick> picks(static_cast<size_t>(M));
  t.generated.resize(static_cast<size_t>(M * (N + 1)));
  for (int64_t i = 0; i < M; ++i) seqs[i] = dec.open(P + N);
  auto t0 = Clock::now();
  for (int64_t i = 0; i < M; ++i) {
    const std::vector<float> last = dec.prefill(seqs[i], prompts + i * P, P);
    greedy_tokens(last.data(), 1, V, &tok[i]);
  }
  t.prefill_s = seconds_since(t0);
  for (int64_t i = 0; i < M; ++i) t.generated[i * (N + 1)] = tok[i];
  t.trace = cuda::begin_kernel_trace(trace.path, trace.cuda, "bench-decode");
  t0 = Clock::now();
  const double picked0 = dec.pick_seconds();
  for (int64_t s = 1; s <= N; ++s) {
    t.rows += dec.decode_pick(seqs.data(), tok.data(), M, greedy.data(), picks.data());
    if (means) means->add(dec.last_step());
    for (int64_t i = 0; i < M; ++i) t.generated[i * (N + 1) + s] = tok[i] = picks[static_cast<size_t>(i)].token;
  }
  t.decode_s = seconds_since(t0);
  cuda::end_kernel_trace(t.trace, "bench-decode", "jtok bench-decode --device cuda: decode batch " + std::to_string(M),
                         N);
  t.sample_s = dec.pick_seconds() - picked0;
  for (int64_t i = 0; i < M; ++i) dec.close(seqs[i]);
  return t;
}

// One sequence of L tokens prefilled in pieces of at most `piece`; generated: the argmax after it.
RunTimes prefill_run(Decoder& dec, const std::vector<int32_t>& prompt, int64_t piece, int64_t V,
                     const TraceAsk& trace = {}) {
  RunTimes t;
  const int64_t L = static_cast<int64_t>(prompt.size());
  const int64_t seq = dec.open(L);
  std::vector<float> last;
  t.trace = cuda::begin_kernel_trace(trace.path, trace.cuda, "bench-decode");
  const auto t0 = Clock::now();
  for (int64_t at = 0; at < L; at += piece) last = dec.prefill(seq, prompt.data() + at, std::min(piece, L - at));
  t.prefill_s = seconds_since(t0);
  cuda::end_kernel_trace(t.trace, "bench-decode", "jtok bench-decode --device cuda: prefill of " + std::to_string(L),
                         1);
  t.generated.resize(1);
  greedy_tokens(last.data(), 1, V, t.generated.data());
  dec.close(seq);
  return t;
}

}  // namespace

int64_t step_weight_bytes(const Model& m, const std::string& device, const cuda::DecoderSettings& s) {
  const ModelConfig& c = m.cfg;
  const bool cuda = device == "cuda";
  const int64_t d = c.hidden_size, e = s.bf16 ? 2 : 4, plain = cuda ? e : 4;  // routers, and fp32 matrices
  const cuda::DecoderQ8Sizes z = cuda::decoder_q8_sizes(c);
  const int64_t values = z.values - z.routed_values, rows = z.rows - z.routed_rows;  // read by every step
  int64_t bytes = 0;
  if (m.lowp.dtype == Dtype::int8 && (!cuda || s.int8_decode))
    bytes = values + 4 * rows;
  else if (cuda)
    bytes = e * values;
  else
    bytes = (m.lowp.dtype == Dtype::bf16 ? 2 : 4) * values;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)  // MoE's routers (never low precision)
    if (c.moe_on_layer(l)) bytes += plain * c.n_routed_experts * d;
  if (c.jtokm) bytes += plain * c.jtokm_num_layers() * c.jtokm_n_e * d;
  return bytes;
}

namespace {

// The fields every line of a mode carries.
nlohmann::json line_base(const BenchDecodeOptions& opt, const std::string& mode, const std::string& describe,
                         int64_t weight_bytes) {
  return {{"engine", "jtok"},
          {"device", opt.device},
          {"table_rows", mode},
          {"decoder", describe},
          {"precision", opt.settings.bf16 ? "bf16" : "fp32"},
          {"kv_dtype", opt.settings.kv_bf16 ? "bf16" : "f32"},
          {"model", opt.model},
          {"warmup", opt.warmup},
          {"repeat", opt.repeat},
          {"step_weight_bytes", weight_bytes}};
}

// One more run of a line's shape with the device's work traced (JTOK_KERNEL_TRACE, bench_decode.h),
// after its timed runs; what the line says of it: the file and its records, whether its tokens are
// the timed runs', or why no trace ran (off a GPU, without the run; a failure in it, the line kept).
template <typename Run>
nlohmann::json traced_run(const BenchDecodeOptions& opt, const nlohmann::json& j, const std::string& run, Run&& go) {
  std::string stem = opt.kernel_trace;
  if (stem.ends_with(".csv")) stem.resize(stem.size() - 4);
  const TraceAsk ask{stem + "-" + j["table_rows"].get<std::string>() + "-" + run + ".csv", opt.device == "cuda"};
  if (!ask.cuda) return cuda::kernel_trace_json(cuda::begin_kernel_trace(ask.path, false, "bench-decode"));
  RunTimes t;
  try {
    t = go(ask);
  } catch (const Error& e) {  // the timed line stands without its trace
    cuda::kernel_trace_stop();
    std::fprintf(stderr, "bench-decode: no kernel trace in %s: %s\n", ask.path.c_str(), e.what());
    return {{"file", ask.path}, {"error", e.what()}};
  }
  nlohmann::json out = cuda::kernel_trace_json(t.trace);
  if (!t.trace.error.empty()) return out;
  out["same_tokens"] = hex64(fnv1a64(t.generated.data(), t.generated.size() * sizeof(int32_t))) == j["tokens_fnv1a"];
  return out;
}

// The medians of `repeat` decode runs of batch M as a line.
nlohmann::json decode_line(Decoder& dec, const BenchDecodeOptions& opt, nlohmann::json j, const std::vector<int32_t>& prompts,
                           int64_t M, int64_t V) {
  const int64_t P = opt.prompt_len, N = opt.new_tokens;
  std::vector<double> pre, dtok, tpot, sample;
  RunTimes last;
  StepMeans means;
  for (int64_t r = 0; r < opt.repeat; ++r) {
    last = decode_run(dec, prompts.data(), M, P, N, V, &means);
    pre.push_back(static_cast<double>(M * P) / last.prefill_s);
    dtok.push_back(static_cast<double>(M * N) / last.decode_s);
    tpot.push_back(1e3 * last.decode_s / static_cast<double>(N));
    sample.push_back(1e3 * last.sample_s / static_cast<double>(N));
  }
  j.update({{"run", "decode"},
            {"batch", M},
            {"prompt", P},
            {"new_tokens", N},
            {"prefill_tok_s", median(pre)},
            {"decode_tok_s", median(dtok)},
            {"tpot_ms", median(tpot)},
            {"weight_gbs", j["step_weight_bytes"].get<double>() / (median(tpot) * 1e-3) / 1e9},
            {"sample_ms_per_step", median(sample)},
            {"rows_per_step", static_cast<double>(last.rows) / static_cast<double>(N)},
            {"prefill_tok_s_each", pre},
            {"decode_tok_s_each", dtok},
            {"prompt_fnv1a", hex64(fnv1a64(prompts.data(), static_cast<size_t>(M * P) * sizeof(int32_t)))},
            {"tokens_fnv1a", hex64(fnv1a64(last.generated.data(), last.generated.size() * sizeof(int32_t)))}});
  add_peak_memory(j, opt.device);
  if (dec.last_graph_kernels() > 0) {  // the last step's graph
    j["graph_kernels"] = dec.last_graph_kernels();
    j["graph_pdl_edges"] = dec.last_graph_pdl_edges();
  }
  std::fprintf(stderr,
               "bench-decode %s %s batch %" PRId64 ": prefill %" PRId64 " x %" PRId64 " %.1f tok/s | decode %" PRId64
               " steps %.1f tok/s, TPOT %.3f ms (host argmax %.3f ms), weights read at %.1f GB/s | peak RSS %.0f MB\n",
               opt.device.c_str(), j["table_rows"].get<std::string>().c_str(), M, M, P, median(pre), N, median(dtok),
               median(tpot), median(sample), j["weight_gbs"].get<double>(), peak_rss_mb());
  if (means.steps > 0) {  // the decoder profiles (JTOK_PROFILE=1): the overlap of the rows with the layers
    j["step_breakdown"] = means.json();
    std::fprintf(stderr, "bench-decode %s batch %" PRId64 " %s\n", j["table_rows"].get<std::string>().c_str(), M,
                 means.line().c_str());
  }
  if (!opt.kernel_trace.empty())
    j["kernel_trace"] = traced_run(opt, j, "b" + std::to_string(M), [&](const TraceAsk& ask) {
      return decode_run(dec, prompts.data(), M, P, N, V, nullptr, ask);
    });
  return j;
}

nlohmann::json prefill_line(Decoder& dec, const BenchDecodeOptions& opt, nlohmann::json j, const std::vector<int32_t>& prompt,
                            int64_t V) {
  std::vector<double> pre;
  RunTimes last;
  for (int64_t r = 0; r < opt.repeat; ++r) {
    last = prefill_run(dec, prompt, opt.max_prefill, V);
    pre.push_back(static_cast<double>(prompt.size()) / last.prefill_s);
  }
  j.update({{"run", "prefill"}, {"batch", 1}, {"prompt", prompt.size()}, {"prefill_tok_s", median(pre)},
            {"prefill_ms", 1e3 * static_cast<double>(prompt.size()) / median(pre)}, {"prefill_tok_s_each", pre},
            {"prompt_fnv1a", hex64(fnv1a64(prompt.data(), prompt.size() * sizeof(int32_t)))},
            {"tokens_fnv1a", hex64(fnv1a64(last.generated.data(), sizeof(int32_t)))}});
  add_peak_memory(j, opt.device);
  std::fprintf(stderr, "bench-decode %s %s prefill of %zu tokens: %.1f tok/s (%.2f ms)\n", opt.device.c_str(),
               j["table_rows"].get<std::string>().c_str(), prompt.size(), median(pre), j["prefill_ms"].get<double>());
  if (!opt.kernel_trace.empty())
    j["kernel_trace"] = traced_run(
        opt, j, "prefill", [&](const TraceAsk& ask) { return prefill_run(dec, prompt, opt.max_prefill, V, ask); });
  return j;
}

// The decoder's settings for these runs: every batch, the longest prefill piece, and KV pages for
// the largest run (its sequences at P + N, or the long prompt), each sequence rounded up to pages.
cuda::DecoderSettings run_settings(const BenchDecodeOptions& opt, const std::string& mode) {
  cuda::DecoderSettings s = opt.settings;
  if (!mode.empty()) s.table_rows = mode;
  const int64_t M = *std::max_element(opt.batches.begin(), opt.batches.end());
  s.max_batch = M;
  s.max_prefill = std::max(opt.prompt_len, std::min(opt.long_prompt, opt.max_prefill));
  const auto pages = [&](int64_t n) { return (n + s.page_tokens - 1) / s.page_tokens * s.page_tokens; };
  s.kv_tokens = std::max(M * pages(opt.prompt_len + opt.new_tokens), pages(opt.long_prompt));
  return s;
}

}  // namespace

std::vector<int32_t> shard_prompts(const std::string& data, int64_t sequences, int64_t len, int64_t vocab) {
  std::vector<std::string> shards;
  try {
    shards = list_shards(data);
  } catch (const Error& e) {
    fail("bench-decode: no token shards in ", data, " (", e.what(), "): run scripts/prepare_data.sh or pass --data DIR");
  }
  LoaderOptions lo;
  lo.mode = "sequential";
  lo.vocab_size = static_cast<uint32_t>(vocab);  // every id checked against the model's
  DataLoader loader(shards, lo);
  return loader.next_batch(static_cast<int>(sequences), static_cast<int>(len)).inputs;
}

void greedy_tokens(const float* logits, int64_t M, int64_t V, int32_t* out) {
#pragma omp parallel for schedule(static) if (M > 1 && M * V >= kParallelMin)
  for (int64_t i = 0; i < M; ++i) {
    // The largest value (a vectorised reduction), then the first id holding it: ties go to the
    // lowest id, as sample_token's greedy pick. A NaN row gives id 0.
    const float* x = logits + i * V;
    float top = x[0];
#pragma omp simd reduction(max : top)
    for (int64_t v = 1; v < V; ++v) top = std::max(top, x[v]);
    int64_t best = 0;
    while (best < V && !(x[best] == top)) ++best;
    out[i] = static_cast<int32_t>(best < V ? best : 0);
  }
}

std::vector<nlohmann::json> bench_decode(const Model& m, const BenchDecodeOptions& opt,
                                         const std::function<void(const nlohmann::json&)>& on_line) {
  const int64_t V = m.cfg.vocab_size, P = opt.prompt_len, N = opt.new_tokens, L = opt.long_prompt;
  if (opt.batches.empty() || opt.repeat < 1 || P < 1 || N < 1 || L < 0 || opt.warmup < 0 || opt.max_prefill < 1)
    fail("bench-decode: batches, --repeat, --prompt-len, --new-tokens and --max-prefill must be positive, "
         "--long-prompt and --warmup at least 0");
  if (std::max(P + N, L) > m.cfg.max_position_embeddings)
    fail("bench-decode: prompt + new tokens (", P + N, ") and the long prompt (", L, ") must fit the model's context of ",
         m.cfg.max_position_embeddings, " positions (max_position_embeddings)");
  const int64_t M_max = *std::max_element(opt.batches.begin(), opt.batches.end());
  const std::vector<int32_t> prompts = shard_prompts(opt.data, M_max, P, V);
  const std::vector<int32_t> long_prompt = L > 0 ? shard_prompts(opt.data, 1, L, V) : std::vector<int32_t>{};
  std::vector<std::string> modes = opt.table_rows;
  if (opt.device != "cuda" || modes.empty()) modes = {opt.device == "cuda" ? opt.settings.table_rows : ""};
  std::vector<nlohmann::json> lines;
  for (const std::string& mode : modes) {
    const cuda::DecoderSettings settings = run_settings(opt, mode);
    if (opt.device == "cuda") {
      cuda::reset_device_bytes_peak();  // the last mode's decoder is gone: this mode's peak from here
      std::fprintf(
          stderr, "bench-decode: %s\n",
          cuda::decoder_plan_line(cuda::decoder_memory_plan(m.cfg, settings, m.lowp.dtype == Dtype::int8)).c_str());
    }
    std::unique_ptr<Decoder> dec = make_decoder(m, opt.device, settings);
    const nlohmann::json base =
        line_base(opt, mode.empty() ? opt.device : mode, dec->describe(), step_weight_bytes(m, opt.device, settings));
    std::fprintf(stderr, "bench-decode: %s\n", dec->describe().c_str());
    for (int64_t w = 0; w < opt.warmup; ++w) {  // every shape once: caches, CUDA graphs, pages
      for (int64_t M : opt.batches) decode_run(*dec, prompts.data(), M, P, N, V);
      if (L > 0) prefill_run(*dec, long_prompt, opt.max_prefill, V);
    }
    const auto add = [&](nlohmann::json j) {
      if (on_line) on_line(j);
      lines.push_back(std::move(j));
    };
    for (int64_t M : opt.batches) add(decode_line(*dec, opt, base, prompts, M, V));
    if (L > 0) add(prefill_line(*dec, opt, base, long_prompt, V));
  }
  return lines;
}

}  // namespace jtok
