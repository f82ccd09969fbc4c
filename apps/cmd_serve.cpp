// `jtok serve`: an OpenAI-style HTTP server over a checkpoint, with continuous batching
// (src/serve/engine.h) and the token tables in RAM or left in the memory-mapped checkpoint file, on
// the CPU or the GPU (--device cuda: cuda/decoder.h, its paged KV cache sized from the KV budget).
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "cuda/decoder_sizes.h"
#include "data/tokenizer.h"
#include "run_setup.h"
#include "serve/engine.h"
#include "serve/http_api.h"

namespace cmd_serve {

struct Args {
  std::string checkpoint, host = "127.0.0.1", api_key, model_name = "jtok", kv_dtype = "auto";
  jtok::DecoderChoice decoder;
  std::string chat_template;
  jtok::TableSource table_src;
  int port = 8080;
  bool prefetch = true, prefix_cache = true, keep_alive_on_device_loss = false;
  int64_t max_batch = 16, prefill_chunk = 512, ctx = 0, kv_budget_tokens = 0, max_queue = 64, max_body_kb = 1024, max_n = 8;
  int64_t prefix_block = 0, page_tokens = 16;
} args;

// Where the model's tokenizer_config.json (its chat template) is: beside the checkpoint (an
// imported model), in its tokenizer directory, or in the default files of its tokenizer; "" none.
std::string chat_template_dir(const jtok::LoadedCheckpoint& ck) {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs = {ck.dir};
  if (!ck.cfg.train.tokenizer_dir.empty()) dirs.push_back(ck.cfg.train.tokenizer_dir);
  try {
    dirs.push_back(jtok::default_tokenizer_dir(ck.cfg.train.tokenizer));
  } catch (const jtok::Error&) {  // no default files on this machine: only the other places
  }
  for (const auto& d : dirs)
    if (fs::exists(fs::path(d) / "tokenizer_config.json")) return d;
  return "";
}

jtok::EngineOptions engine_options() {
  jtok::EngineOptions eo;
  eo.max_batch = args.max_batch;
  eo.ctx = args.ctx;
  eo.kv_budget_tokens = args.kv_budget_tokens;
  eo.max_queue = args.max_queue;
  eo.prefetch = args.prefetch;
  eo.prefill_chunk = args.prefill_chunk;
  const std::string kv = args.kv_dtype == "auto" ? (args.decoder.device == "cuda" ? "bf16" : "f32") : args.kv_dtype;
  eo.kv_bf16 = jtok::parse_dtype(kv, "--kv-dtype", jtok::kKvDtypes) == jtok::Dtype::bf16;
  eo.prefix_cache = args.prefix_cache;
  eo.prefix_block = args.prefix_block > 0 ? args.prefix_block : std::min<int64_t>(64, args.prefill_chunk);
  return eo;
}

// The engine's decoder: the CPU's, or the GPU's with a page for every KV slot of the budget (stored
// prefix blocks included: they share their pages) and one partly used page a sequence.
std::unique_ptr<jtok::Decoder> make_serve_decoder(const jtok::Model& m, const jtok::EngineOptions& eo) {
  if (args.decoder.device != "cuda") return jtok::make_cpu_decoder(m, eo.kv_bf16);
  jtok::cuda::DecoderSettings s = jtok::decoder_settings(args.decoder, eo.kv_bf16);
  s.max_batch = eo.max_batch;
  s.max_prefill = eo.prefill_chunk;
  s.page_tokens = args.page_tokens;
  s.max_seqs = eo.max_batch;
  s.kv_tokens = eo.kv_budget_tokens + eo.max_batch * args.page_tokens;
  std::fprintf(
      stderr, "serve: %s\n",
      jtok::cuda::decoder_plan_line(jtok::cuda::decoder_memory_plan(m.cfg, s, m.lowp.dtype == jtok::Dtype::int8))
          .c_str());
  return jtok::make_decoder(m, "cuda", s);
}

jtok::ServeOptions serve_options(const jtok::LoadedCheckpoint& ck) {
  jtok::ServeOptions so;
  so.host = args.host;
  so.port = args.port;
  so.api_key = args.api_key;
  so.model_id = args.model_name;
  so.max_body_bytes = static_cast<size_t>(args.max_body_kb) * 1024;
  so.tables = args.table_src.placement();
  if (args.max_n < 1) jtok::fail("--max-n must be at least 1, got ", args.max_n);
  so.max_n = args.max_n;
  so.chat_template = args.chat_template;
  so.exit_on_device_loss = !args.keep_alive_on_device_loss;
  so.chat_template_dir = chat_template_dir(ck);
  return so;
}

// The start-up line, once the server listens on `port`.
void print_listening(const jtok::LoadedCheckpoint& ck, const jtok::Engine& engine, int port) {
  std::printf(
      "serve: %s on http://%s:%d (device %s, tables %s, max batch %lld, context %lld, KV budget %lld tokens, "
      "prefix reuse %s)\n",
      ck.dir.c_str(), args.host.c_str(), port, engine.describe().c_str(), args.table_src.placement().c_str(),
      static_cast<long long>(engine.options().max_batch), static_cast<long long>(engine.options().ctx),
      static_cast<long long>(engine.options().kv_budget_tokens),
      args.prefix_cache ? ("blocks of " + std::to_string(engine.options().prefix_block)).c_str() : "off");
  std::fflush(stdout);
}

// Runs api until it returns; a thread waiting on `sigs` (SIGINT / SIGTERM) stops it.
void run_until_signal(jtok::HttpApi& api, const sigset_t& sigs, const std::function<void(int)>& on_listening) {
  std::atomic<bool> returned{false};  // api.run has returned
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (returned.load()) return;  // woken below, after run() returned by itself (an error)
    std::fprintf(stderr, "serve: signal %d, stopping\n", sig);
    api.stop();
  });
  try {
    api.run(on_listening);
  } catch (...) {
    returned = true;
    pthread_kill(waiter.native_handle(), SIGTERM);
    waiter.join();
    throw;
  }
  returned = true;
  waiter.join();
}

void run() {
  using namespace jtok;
  // SIGINT / SIGTERM are taken by one thread (sigwait) that stops the server: blocked here, before
  // any thread exists, so every thread inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::fprintf(stderr, "%s\n", command_line_string().c_str());
  resolve_hbm_tables(args.table_src, args.decoder);
  check_decoder_choice(args.decoder);  // --device cuda: the GPU, or why not, before anything is read
  if (args.decoder.device != "cuda" && args.page_tokens != 16) fail("--kv-page-tokens is for --device cuda");
  LoadedCheckpoint ck = load_for_inference(args.checkpoint, args.table_src, args.decoder.device == "cpu");
  const EngineOptions eo = resolve_engine_options(ck.model, engine_options());
  Engine engine(ck.model, eo, make_serve_decoder(ck.model, eo));
  HttpApi api(engine, ck.tokenizer, serve_options(ck));
  run_until_signal(api, sigs, [&](int port) { print_listening(ck, engine, port); });
}

void setup(CLI::App* sub) {
  sub->add_option("--checkpoint", args.checkpoint, "checkpoint directory, or a run directory (its newest)")->required();
  sub->add_option("--host", args.host, "address to bind (loopback unless told)");
  sub->add_option("--port", args.port, "port (0: any free port, printed at start)");
  add_table_source_options(sub, args.table_src);
  sub->add_option("--max-batch", args.max_batch, "sequences decoded together at most");
  sub->add_option("--prefill-chunk", args.prefill_chunk,
                  "prompt tokens prefilled between two decode steps at most (longer prompts: in chunks)");
  sub->add_option("--ctx", args.ctx, "context per sequence, prompt + completion (0: the model's)");
  sub->add_option("--kv-budget-tokens", args.kv_budget_tokens,
                  "KV-cache token slots over all sequences and the stored prefix blocks, which are evicted least "
                  "recently used to make room (0: max-batch x ctx, plus one ctx for the prefix blocks unless --no-prefix-cache)");
  sub->add_option("--prefix-block", args.prefix_block,
                  "prefix reuse: tokens a block (prompts are prefilled in pieces of this many, whole blocks are kept "
                  "for later prompts that begin with the same tokens); at most --prefill-chunk (0: 64, or --prefill-chunk "
                  "if smaller)");
  sub->add_flag("!--no-prefix-cache", args.prefix_cache,
                "no prefix reuse: every prompt prefilled from its start (whole, or in --prefill-chunk pieces)");
  sub->add_option("--kv-dtype", args.kv_dtype,
                  "KV caches: f32 (exact) or bf16 (half the bytes a decoding step reads); default f32 on the CPU, bf16 on cuda");
  add_decoder_options(sub, args.decoder);
  sub->add_option("--kv-page-tokens", args.page_tokens,
                  "cuda: positions a KV page holds (default 16); --prefix-block must be a multiple of it");
  sub->add_option("--max-queue", args.max_queue, "requests waiting for a batch slot at most; beyond: 429");
  sub->add_option("--max-n", args.max_n,
                  "n and best_of of a completion at most (each choice takes a batch slot: at most --max-batch); beyond: 400");
  sub->add_option("--max-body-kb", args.max_body_kb, "largest request body in KiB; beyond: 413");
  sub->add_flag("!--no-prefetch", args.prefetch, "mmap tables: no prefetch thread (rows are faulted in by the gathers)");
  sub->add_option("--api-key", args.api_key, "require 'Authorization: Bearer KEY' on /v1/*");
  sub->add_option("--model-name", args.model_name, "the model's name in the API");
  sub->add_flag("--keep-alive-on-device-loss", args.keep_alive_on_device_loss,
                "a lost device (a sticky CUDA error: nothing more runs on it in this process) leaves the server "
                "up, answering 503 and /health 503; by default it stops and exits with 1, for a supervisor to "
                "start it again");
  sub->add_option("--chat-template", args.chat_template,
                  "chat template family for /v1/chat/completions (chatml, qwen3, llama3, llama3.1) instead of "
                  "the one recognised in the model's tokenizer_config.json")
      ->check(CLI::IsMember({"chatml", "qwen3", "llama3", "llama3.1"}));
  sub->callback(run);
}

const bool registered = jtok::register_command({"serve", "serve a checkpoint over HTTP (OpenAI-style API)", setup});

}  // namespace cmd_serve
