// The serving engine: continuous batching of generation requests over one model.
//
// One scheduler thread owns the model's compute. Between decode steps it admits waiting requests
// (while fewer than max_batch run and their KV caches fit the budget), prefills new prompts alone,
// at most prefill_chunk prompt tokens per step (a longer prompt is prefilled in chunks, one per
// step, so the running sequences keep decoding meanwhile), then runs one decode step over every
// active sequence together (decode_batch: the
// backbone's matrix products take M = active sequences), samples each sequence's next token with
// its own settings and RNG, and publishes it (with its log-probs when asked). A request of n choices
// is admitted as a whole, its prompt prefilled once, then each further choice decodes its own copy of
// the prompt's KV cache with its own RNG. Requests beyond the waiting queue's bound are refused
// (the caller answers 429). Token ids only: text is the HTTP layer's business.
//
// With prefix reuse on (EngineOptions::prefix_cache), every prompt is prefilled in pieces of
// prefix_block tokens at positions that are multiples of it (prefill_chunked's pieces with chunk =
// prefix_block; several pieces a step within prefill_chunk tokens), each whole block kept in a
// PrefixCache, and a prompt that begins with stored blocks starts from them (the decoder's blocks:
// copies on the CPU, shared KV pages on the GPU): its tokens and log-probs are the bits of a cold
// prefill in the same pieces.
//
// The compute goes through one Decoder (infer/decoder.h: the CPU engine, or the GPU's), used by the
// scheduler thread alone; a sequence is a decoder handle, closed when the sequence ends.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "infer/decoder.h"
#include "infer/generate.h"
#include "infer/logprobs.h"
#include "infer/prefetch.h"
#include "model/transformer.h"
#include "serve/prefix_cache.h"

namespace jtok {

struct EngineOptions {
  int64_t max_batch = 16;        // sequences decoded together at most
  int64_t ctx = 0;               // context per sequence (prompt + generated); 0 = the model's
  int64_t kv_budget_tokens = 0;  // KV-cache token slots over all active sequences and stored prefix blocks
                                 // (a block the decoder shares with sequences counted once);
                                 // 0 = max_batch * ctx (+ ctx with prefix_cache)
  int64_t max_queue = 64;        // requests waiting for admission at most (beyond: refused)
  bool prefetch = true;          // memory-mapped tables: a helper thread (RowPrefetcher) brings in the
                                 // rows of every prompt piece and decode step before it computes; disk
                                 // tables: the store's I/O threads read a prompt's blocks at admission
                                 // and a token's right after it is sampled (prefetch_disk_rows)
  int64_t prefill_chunk = 512;   // prompt tokens prefilled between two decode steps at most. A prompt
                                 // of at most this many is prefilled whole (prefill: as jtok generate
                                 // does); a longer one in chunks of exactly this many (prefill_chunked)
  bool kv_bf16 = false;          // KV caches in bf16 (KVCache::bf16): half the bytes a step reads (the
                                 // CPU decoder Engine makes; a decoder handed to it has its own setting)
  bool prefix_cache = false;     // prefix reuse (above); its blocks share kv_budget_tokens with the sequences
  int64_t prefix_block = 64;     // tokens a block (at most prefill_chunk)
};

struct GenerationRequest {
  std::vector<int32_t> prompt;   // token ids, 1 <= size, size + max_tokens <= ctx (checked by submit)
  int64_t max_tokens = 16;       // 0: the prompt is only prefilled (for its log-probs), finish "length"
  SamplingParams sampling;
  uint64_t seed = 0;
  std::vector<int32_t> stop_tokens;  // each ends the sequence (finish "stop"), not part of the output
                                     // (eos; a chat model's end of turn too)
  int64_t n = 1;                 // choices: the prompt is prefilled once, each choice decodes its own copy
                                 // of its KV cache; choice i samples with seed + i (mod 2^64), so it is
                                 // what a request of n = 1 with that seed gives
  int top_logprobs = -1;         // -1: none; 0..kMaxTopLogprobs: each sampled token's log-prob and the
                                 // top that many (Sequence::logprobs)
  bool prompt_logprobs = false;  // the log-prob of every prompt token after the first, with the same
                                 // top_logprobs (>= 0), from the prefill (Sequence::prompt_logprobs)
};

// A request's progress, shared by the scheduler (writer) and the caller (reader).
struct Sequence {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;   // generated so far (the stop token excluded)
  std::vector<TokenLogprob> logprobs;         // one per token of `tokens` (top_logprobs >= 0)
  std::vector<TokenLogprob> prompt_logprobs;  // prompt tokens 1..P-1 (prompt_logprobs), set before the first token
  uint64_t seed = 0;             // the seed this choice samples with
  bool done = false;
  std::string finish_reason;     // "length", "stop" (stop token, or the caller's stop), "error", "cancelled"
  std::string error;             // when finish_reason == "error"
  std::atomic<bool> cancel{false};  // set by the caller (client gone, stop string seen): freed before the next step
  // Set with the first token (or the finish of max_tokens 0): the prompt tokens taken from stored
  // blocks, and the time the scheduler spent on this prompt (copying them in, prefilling the rest).
  int64_t cached_tokens = 0;
  double prefill_ms = 0;
};

// Counters for /metrics (monotonic unless named as a gauge).
struct EngineStats {
  // Requests admitted / finished / cancelled count choices: a request of n choices counts n.
  int64_t requests_admitted = 0, requests_finished = 0, requests_refused = 0, requests_cancelled = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, decode_steps = 0, decode_batch_sum = 0, prefills = 0;
  int64_t prefill_chunks = 0;    // prompt pieces computed (a whole short prompt is one)
  int64_t decode_steps_during_prefill = 0;  // decode steps run while a prompt was partly prefilled
  int64_t prefilling = 0;        // gauge: admitted prompts not fully prefilled yet
  int64_t choices_forked = 0;    // choices 2..n of requests, started from a copy of the prompt's KV cache
  int64_t prompt_logprob_tokens = 0;  // prompt tokens whose log-prob was computed (echo with logprobs)
  int64_t table_rows_read = 0;   // token-table rows gathered by decode steps, per table
  int64_t table_rows_prefetched = 0;  // (table, id) rows handed to the prefetch thread (mmap tables only)
  int64_t prefetch_pages = 0, prefetch_major_faults = 0;  // pages it touched; major faults it took
  int64_t prefetch_dropped = 0;  // prefetch jobs dropped unstarted (the thread fell behind)
  int64_t queue_depth = 0, active = 0, kv_tokens_used = 0;  // gauges
  // Prefix reuse (PrefixCacheStats): tokens reused, prompts that reused any, blocks stored / evicted,
  // and the gauges blocks cached / held by running sequences.
  int64_t prefix_tokens_reused = 0, prefix_hits = 0, prefix_blocks_stored = 0, prefix_blocks_evicted = 0;
  int64_t prefix_blocks_cached = 0, prefix_blocks_held = 0;
  int64_t batch_hist[6] = {};    // decode steps with M in 1, 2-3, 4-7, 8-15, 16-31, 32+
  std::optional<TableStore::Stats> table_store;  // disk tables: the store's cache and read counters
  bool device_lost = false;                      // Engine::device_lost() is set: nothing more runs
};

// opt with its defaults filled in for model (ctx, kv_budget_tokens) and checked: what Engine runs with.
EngineOptions resolve_engine_options(const Model& model, EngineOptions opt);

// A decoder sequence owned by one request's choice: closed when it goes (it moves with it).
class DecoderSeq {
 public:
  DecoderSeq() = default;
  DecoderSeq(Decoder* d, int64_t id) : d_(d), id_(id) {}
  DecoderSeq(DecoderSeq&& o) noexcept : d_(o.d_), id_(o.id_) { o.id_ = -1; }
  DecoderSeq& operator=(DecoderSeq&& o) noexcept {
    if (this != &o) {
      reset();
      d_ = o.d_;
      id_ = o.id_;
      o.id_ = -1;
    }
    return *this;
  }
  DecoderSeq(const DecoderSeq&) = delete;
  DecoderSeq& operator=(const DecoderSeq&) = delete;
  ~DecoderSeq() { reset(); }
  int64_t id() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }
  void reset() {
    if (d_ && id_ >= 0) d_->close(id_);
    id_ = -1;
  }

 private:
  Decoder* d_ = nullptr;
  int64_t id_ = -1;
};

class Engine {
 public:
  // On the CPU (make_cpu_decoder(model, opt.kv_bf16)).
  Engine(const Model& model, EngineOptions opt);
  // On `decoder` (over model; the engine owns it). Prefix reuse needs opt.prefix_block a multiple of
  // decoder->block_granule().
  Engine(const Model& model, EngineOptions opt, std::unique_ptr<Decoder> decoder);
  ~Engine();  // stops the scheduler; unfinished sequences end with "cancelled"
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineOptions& options() const { return opt_; }
  const std::string& describe() const { return describe_; }  // the decoder's line ("cpu", the GPU's)
  // Checks the request (empty prompt, ids outside the vocabulary, max_tokens < 0, prompt + max_tokens
  // beyond the context, n outside [1, max_batch] or n x (prompt + max_tokens) beyond the KV budget,
  // top_logprobs outside [-1, 20]: throws jtok::Error with a message for the client) and queues it.
  // Returns its n sequences (choice i samples with seed + i), or none when the waiting queue is full
  // (the caller refuses with 429). The n choices are admitted together.
  std::vector<std::shared_ptr<Sequence>> submit_choices(GenerationRequest req);
  // submit_choices of a request with n = 1: its sequence, or null when the queue is full.
  std::shared_ptr<Sequence> submit(GenerationRequest req);
  EngineStats stats() const;
  // The decoder's device lost (a jtok::DeviceLost from a step, such as a CUDA illegal address: no
  // more work can run on it in this process): its message, "" while the device works. From then on
  // the scheduler runs no step, the queued, prefilling and running requests end with "error" and
  // that message, and submit_choices throws DeviceLost (the server answers 503).
  std::string device_lost() const;
  // While paused, the scheduler admits nothing and runs no step (requests still queue). Between
  // steps only: a step under way finishes first.
  void pause(bool on);

 private:
  struct Active {
    GenerationRequest req;
    std::shared_ptr<Sequence> seq;
    DecoderSeq kv;         // its keys and values (none until its first piece)
    std::mt19937_64 rng;
    int32_t last = -1;     // the token to decode next
    int64_t produced = 0;  // tokens sampled (the stop token included)
    int64_t need = 0;      // KV slots reserved (less the positions it maps from shared stored blocks)
    int64_t prefilled = 0; // prompt tokens in the cache
    std::vector<std::shared_ptr<Sequence>> others;  // choices 1..n-1, until the prompt is prefilled
    std::vector<TokenLogprob> prompt_lp;            // prompt tokens 1..P-1 (prompt_logprobs)
    bool started = false;  // prefix reuse: stored blocks looked up (at its first piece)
    bool storing = true;   // prefix reuse: its blocks go on being stored (false once one found no room)
    BlockHold blocks;      // prefix reuse: the chain of its prompt's stored blocks (a fork's too, when shared)
    int64_t cached = 0;    // prompt tokens from stored blocks
    int64_t announced_from = 0;  // disk tables: prompt tokens from here on handed to the read-ahead at admission
    double prefill_sec = 0;
  };
  void loop();
  void admit();  // (mu_ held) frees cancelled sequences, admits waiting requests while slots and KV allow
  // One decode step over every running sequence together, each row's token picked where its logits
  // are (Decoder::decode_pick: on a GPU, from the row's digest), publishes, frees the finished.
  void decode_running(std::vector<std::unique_ptr<Active>>& running, bool partly_prefilled);
  void finish(Active& a, const std::string& reason, const std::string& error = {});
  // finish, and for the other choices of a request not yet split (waiting or prefilling) too.
  void finish_all(Active& a, const std::string& reason, const std::string& error = {});
  // Prefills p tokens of a's prompt. When the prompt is complete: publishes its log-probs, forks the
  // other choices (their own cache copy and RNG) into `forked`, samples every choice's first token.
  // Accounts for them in stats_ (takes mu_).
  void prefill_piece(Active& a, int64_t p, std::vector<std::unique_ptr<Active>>& forked);
  // prefill_piece's steps: at the prompt's end, the fork and every choice's first token (group: the
  // choices); then the piece counted in stats_ (takes mu_), the finished choices dropped from forked.
  void complete_prompt(Active& a, const std::vector<float>& l, std::vector<Active*>& group,
                       std::vector<std::unique_ptr<Active>>& forked);
  void count_prefill(Active& a, bool complete, const std::vector<Active*>& group,
                     std::vector<std::unique_ptr<Active>>& forked);
  // The prompt pieces of this step (at most prefill_chunk tokens, first come first served), their
  // rows prefetched first; returns the rows handed to the prefetch thread.
  int64_t prefill_step(std::vector<std::unique_ptr<Active>>& forked);
  int64_t prefill_step_blocks(std::vector<std::unique_ptr<Active>>& forked);  // with prefix reuse
  // Prefix reuse, at a prompt's first piece: the stored blocks it begins with, its sequence opened
  // from them (at least one prompt token is left to compute: the logits of the last).
  // Tokens read ahead at admission but prefilled after all (their blocks were evicted since) are
  // read ahead then.
  void start_from_prefix(Active& a);
  void load_prefix(Active& a);  // start_from_prefix's lookup and copy
  // Prefix reuse, after a piece: the prompt's blocks now whole in its cache stored (within the budget).
  void store_blocks(Active& a);
  // Whether `need` more KV slots fit the budget (mu_ held), evicting stored blocks nobody holds.
  bool kv_fits(int64_t need);
  // A shared decoder: n of a's reserved slots now on shared stored blocks, counted there (takes mu_).
  void unreserve(Active& a, int64_t n);
  // The fork of a for choice `other` (its own RNG; the blocks a holds, held again when shared).
  std::unique_ptr<Active> fork_choice(Active& a, int64_t other, int64_t need);
  // Samples from logits (a prompt's last), publishes, and returns whether the sequence goes on.
  bool emit(Active& a, const float* logits);
  // Publishes a picked token (and its log-probs), and returns whether the sequence goes on.
  bool emit_pick(Active& a, TokenPick pick);
  // A step's DeviceLost: kept (the first), said once on stderr, the scheduler woken to end everything.
  void lose_device(const std::string& why);
  // (mu_ held) After the loss: every request not finished ends with "error" and the loss's message.
  void end_after_loss();
  // Hands the prefetch thread the rows ids[0..n) will read (table_rows_needed: JTok's, and all n_e
  // of each JTok-M layer: the router has not chosen yet); returns their number (0: RAM tables).
  int64_t prefetch(const int32_t* ids, int64_t n);

  const Model& model_;
  EngineOptions opt_;
  RowPrefetcher prefetcher_;
  std::unique_ptr<Decoder> decoder_;     // before the blocks and the sequences: they close into it
  std::string describe_;                 // decoder_->describe(), once (the scheduler owns decoder_)
  std::unique_ptr<PrefixCache> prefix_;  // before the sequences: they release their blocks into it
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Active> waiting_;
  std::vector<std::unique_ptr<Active>> active_;
  std::deque<std::unique_ptr<Active>> prefilling_;  // admitted, prompt not fully in the cache; the scheduler's
  EngineStats stats_;
  bool stop_ = false, paused_ = false;
  std::string lost_;  // device_lost()'s message
  std::thread thread_;
};

}  // namespace jtok
