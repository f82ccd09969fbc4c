#include "serve/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "core/error.h"

namespace jtok {

EngineOptions resolve_engine_options(const Model& model, EngineOptions opt) {
  const int64_t max_ctx = model.cfg.max_position_embeddings;
  if (opt.ctx <= 0 || opt.ctx > max_ctx) opt.ctx = max_ctx;
  if (opt.max_batch < 1) fail("--max-batch must be at least 1, got ", opt.max_batch);
  // Stored prefix blocks beside the sequences' caches: one context more for them by default.
  if (opt.kv_budget_tokens <= 0) opt.kv_budget_tokens = (opt.max_batch + (opt.prefix_cache ? 1 : 0)) * opt.ctx;
  if (opt.kv_budget_tokens < opt.ctx)
    fail("the KV-cache budget (", opt.kv_budget_tokens, " tokens) is below one context (", opt.ctx, ")");
  if (opt.max_queue < 0) opt.max_queue = 0;
  if (opt.prefill_chunk < 1) fail("--prefill-chunk must be at least 1 token, got ", opt.prefill_chunk);
  if (opt.prefix_cache && (opt.prefix_block < 1 || opt.prefix_block > opt.prefill_chunk))
    fail("--prefix-block must be in [1, ", opt.prefill_chunk, "] (at most --prefill-chunk), got ", opt.prefix_block);
  return opt;
}

Engine::Engine(const Model& model, EngineOptions opt)
    : Engine(model, opt, make_cpu_decoder(model, opt.kv_bf16)) {}

Engine::Engine(const Model& model, EngineOptions opt, std::unique_ptr<Decoder> decoder)
    : model_(model), opt_(resolve_engine_options(model, opt)), prefetcher_(model), decoder_(std::move(decoder)) {
  if (!decoder_) fail("Engine: no decoder");
  describe_ = decoder_->describe();
  if (opt_.prefix_cache) prefix_ = std::make_unique<PrefixCache>(opt_.prefix_block, *decoder_);
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (auto& a : waiting_) finish_all(a, "cancelled");
  for (auto& a : prefilling_) finish_all(*a, "cancelled");
  for (auto& a : active_) finish(*a, "cancelled");
}

std::vector<std::shared_ptr<Sequence>> Engine::submit_choices(GenerationRequest req) {
  const int64_t P = static_cast<int64_t>(req.prompt.size());
  if (P == 0) fail("the prompt is empty: give at least one token");
  for (int32_t id : req.prompt)
    if (id < 0 || id >= model_.cfg.vocab_size)
      fail("prompt token id ", id, " is outside the vocabulary [0, ", model_.cfg.vocab_size, ")");
  if (req.max_tokens < 0) fail("max_tokens must be at least 0, got ", req.max_tokens);
  if (req.max_tokens > opt_.ctx - P)  // not P + max_tokens: a client's max_tokens near 2^63 would overflow
    fail("the prompt (", P, " tokens) plus max_tokens (", req.max_tokens, ") is longer than the context (",
         opt_.ctx, " tokens)");
  if (req.n < 1 || req.n > opt_.max_batch)
    fail("n (", req.n, " choices) must be in [1, ", opt_.max_batch, "] (the decode batch, --max-batch)");
  if (req.n * (P + req.max_tokens) > opt_.kv_budget_tokens)
    fail(req.n, " choices of ", P + req.max_tokens, " tokens (prompt + max_tokens) each do not fit the KV-cache budget (",
         opt_.kv_budget_tokens, " tokens)");
  if (req.top_logprobs < -1 || req.top_logprobs > kMaxTopLogprobs)
    fail("top_logprobs must be in [-1, ", kMaxTopLogprobs, "], got ", req.top_logprobs);
  if (req.prompt_logprobs && req.top_logprobs < 0) fail("prompt_logprobs needs top_logprobs >= 0");
  Active a;
  a.seq = std::make_shared<Sequence>();
  a.seq->seed = req.seed;
  a.rng.seed(req.seed);
  std::vector<std::shared_ptr<Sequence>> out{a.seq};
  for (int64_t i = 1; i < req.n; ++i) {
    a.others.push_back(std::make_shared<Sequence>());
    a.others.back()->seed = req.seed + static_cast<uint64_t>(i);
    out.push_back(a.others.back());
  }
  a.need = req.n * (P + req.max_tokens);
  a.req = std::move(req);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!lost_.empty()) throw DeviceLost("the server's device was lost and nothing more runs on it (" + lost_ + ")");
    if (static_cast<int64_t>(waiting_.size()) >= opt_.max_queue) {
      stats_.requests_refused++;
      return {};
    }
    waiting_.push_back(std::move(a));
    stats_.queue_depth = static_cast<int64_t>(waiting_.size());
  }
  cv_.notify_all();
  return out;
}

std::shared_ptr<Sequence> Engine::submit(GenerationRequest req) {
  if (req.n != 1) fail("Engine::submit takes one choice (n = 1), got ", req.n, ": use submit_choices");
  auto s = submit_choices(std::move(req));
  return s.empty() ? nullptr : s[0];
}

EngineStats Engine::stats() const {
  const PrefetchStats p = prefetcher_.stats();
  std::lock_guard<std::mutex> lk(mu_);
  EngineStats s = stats_;
  s.prefetch_pages = p.pages;
  s.prefetch_major_faults = p.major_faults;
  s.prefetch_dropped = p.dropped;
  s.table_store = disk_table_stats(model_);
  s.device_lost = !lost_.empty();
  if (prefix_) {
    const PrefixCacheStats q = prefix_->stats();
    s.prefix_tokens_reused = q.tokens_reused;
    s.prefix_hits = q.hits;
    s.prefix_blocks_stored = q.stored;
    s.prefix_blocks_evicted = q.evicted;
    s.prefix_blocks_cached = q.blocks;
    s.prefix_blocks_held = q.held;
  }
  return s;
}

std::string Engine::device_lost() const {
  std::lock_guard<std::mutex> lk(mu_);
  return lost_;
}

void Engine::lose_device(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!lost_.empty()) return;
    lost_ = why;
  }
  std::fprintf(stderr,
               "jtok serve: the device is lost (%s): the requests under way end with this error, and no "
               "step runs on it again\n",
               why.c_str());
  cv_.notify_all();
}

void Engine::end_after_loss() {
  for (auto& a : waiting_) finish_all(a, "error", lost_);
  for (auto& a : prefilling_) finish_all(*a, "error", lost_);
  for (auto& a : active_) finish(*a, "error", lost_);
  waiting_.clear();
  prefilling_.clear();
  active_.clear();
  stats_.queue_depth = stats_.prefilling = stats_.active = 0;
}

void Engine::pause(bool on) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    paused_ = on;
  }
  cv_.notify_all();
}

void Engine::finish(Active& a, const std::string& reason, const std::string& error) {
  {
    std::lock_guard<std::mutex> lk(a.seq->mu);
    if (a.seq->done) return;
    a.seq->done = true;
    a.seq->finish_reason = reason;
    a.seq->error = error;
  }
  a.seq->cv.notify_all();
}

void Engine::finish_all(Active& a, const std::string& reason, const std::string& error) {
  finish(a, reason, error);
  for (auto& o : a.others) {
    {
      std::lock_guard<std::mutex> lk(o->mu);
      if (o->done) continue;
      o->done = true;
      o->finish_reason = reason;
      o->error = error;
    }
    o->cv.notify_all();
  }
}

int64_t Engine::prefetch(const int32_t* ids, int64_t n) {
  if (!opt_.prefetch || !prefetcher_.useful()) return 0;
  std::vector<TableRow> rows = table_rows_needed(model_, ids, n);
  const int64_t k = static_cast<int64_t>(rows.size());
  prefetcher_.submit(std::move(rows));
  return k;
}

// What a's next pick asks: its sampling, its RNG, its top_logprobs.
static PickRequest pick_request(const GenerationRequest& req, std::mt19937_64& rng) {
  return {req.sampling, &rng, req.top_logprobs};
}

bool Engine::emit(Active& a, const float* logits) {
  return emit_pick(a, pick_from_row(logits, model_.cfg.vocab_size, pick_request(a.req, a.rng)));
}

bool Engine::emit_pick(Active& a, TokenPick pick) {
  const int32_t next = pick.token;
  a.produced++;
  a.last = next;
  const bool stop = std::find(a.req.stop_tokens.begin(), a.req.stop_tokens.end(), next) != a.req.stop_tokens.end();
  // Disk tables: its block read now, while the other sequences sample and the next step's first layers run.
  if (opt_.prefetch && !stop && a.produced < a.req.max_tokens) prefetch_disk_rows(model_, &next, 1);
  {
    std::lock_guard<std::mutex> lk(a.seq->mu);
    if (!stop) a.seq->tokens.push_back(next);
    if (!stop && a.req.top_logprobs >= 0) a.seq->logprobs.push_back(std::move(pick.logprob));
  }
  a.seq->cv.notify_all();
  if (stop) {
    finish(a, "stop");
    return false;
  }
  if (a.produced >= a.req.max_tokens) {
    finish(a, "length");
    return false;
  }
  return true;
}

// Prompt log-probs into out (tokens 1..P-1 of req's prompt): position t's logits give token t + 1's.
static PositionLogits prompt_logprob_sink(std::vector<TokenLogprob>& out, const GenerationRequest& req, int64_t V) {
  const int64_t P = static_cast<int64_t>(req.prompt.size());
  // A pass over the vocabulary per row: rows in parallel.
  return [&out, &req, P, V](int64_t pos, int64_t n, const float* logits) {
    const int64_t rows = std::min(n, P - 1 - pos);
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; ++r)
      out[pos + r] = token_logprob(logits + r * V, V, req.prompt[pos + r + 1], req.top_logprobs);
  };
}

void Engine::prefill_piece(Active& a, int64_t p, std::vector<std::unique_ptr<Active>>& forked) {
  const int64_t P = static_cast<int64_t>(a.req.prompt.size());
  PositionLogits each;
  if (a.req.prompt_logprobs) {
    a.prompt_lp.resize(static_cast<size_t>(P - 1));
    each = prompt_logprob_sink(a.prompt_lp, a.req, model_.cfg.vocab_size);
  }
  std::vector<Active*> group{&a};  // the choices that finished or go on from this prompt
  bool complete = false;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    if (!a.kv) a.kv = DecoderSeq(decoder_.get(), decoder_->open(P + a.req.max_tokens));
    // The CPU: an empty sequence's piece by prefill, a started one's by prefill_chunk.
    const std::vector<float> l = decoder_->prefill(a.kv.id(), a.req.prompt.data() + a.prefilled, p, each);
    a.prefilled += p;
    if (prefix_) store_blocks(a);
    a.prefill_sec += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    complete = a.prefilled == P;
    if (complete) complete_prompt(a, l, group, forked);
  } catch (const DeviceLost& e) {
    lose_device(e.what());
    finish_all(a, "error", e.what());
    complete = true;
  } catch (const std::exception& e) {
    finish_all(a, "error", e.what());
    complete = true;
  }
  count_prefill(a, complete, group, forked);
}

std::unique_ptr<Engine::Active> Engine::fork_choice(Active& a, int64_t other, int64_t need) {
  auto b = std::make_unique<Active>();
  b->req = a.req;
  b->seq = a.others[static_cast<size_t>(other)];
  const int64_t P = static_cast<int64_t>(a.req.prompt.size());
  b->kv = DecoderSeq(decoder_.get(), decoder_->fork(a.kv.id(), P + a.req.max_tokens));
  if (decoder_->blocks_shared()) b->blocks = a.blocks.share();  // it maps them: they stay while it runs
  b->rng.seed(b->seq->seed);
  b->need = need;
  b->prefilled = P;
  return b;
}

void Engine::complete_prompt(Active& a, const std::vector<float>& l, std::vector<Active*>& group,
                             std::vector<std::unique_ptr<Active>>& forked) {
  const int64_t per = a.need / (1 + static_cast<int64_t>(a.others.size()));
  std::vector<std::unique_ptr<Active>> made;  // every fork first: one that throws leaves a whole
  for (size_t i = 0; i < a.others.size(); ++i) made.push_back(fork_choice(a, static_cast<int64_t>(i), per));
  for (auto& b : made) {
    group.push_back(b.get());
    forked.push_back(std::move(b));
  }
  a.others.clear();
  a.need = per;
  for (Active* c : group) {
    {
      std::lock_guard<std::mutex> lk(c->seq->mu);
      c->seq->prompt_logprobs = a.prompt_lp;
      c->seq->cached_tokens = a.cached;
      c->seq->prefill_ms = a.prefill_sec * 1e3;
    }
    if (a.req.max_tokens == 0) finish(*c, "length");
    else emit(*c, l.data());
  }
}

void Engine::count_prefill(Active& a, bool complete, const std::vector<Active*>& group,
                           std::vector<std::unique_ptr<Active>>& forked) {
  const int64_t P = static_cast<int64_t>(a.req.prompt.size());
  std::lock_guard<std::mutex> lk(mu_);
  stats_.prefill_chunks++;
  if (!complete) return;
  stats_.prefills++;
  stats_.prompt_tokens += P;
  stats_.choices_forked += static_cast<int64_t>(group.size()) - 1;
  if (a.req.prompt_logprobs) stats_.prompt_logprob_tokens += P - 1;
  for (Active* c : group) {
    stats_.generated_tokens += c->produced;
    if (!c->seq->done) continue;
    stats_.kv_tokens_used -= c->need;  // a's whole reservation when the prefill failed before the split
    stats_.requests_finished += c == &a && !a.others.empty() ? 1 + static_cast<int64_t>(a.others.size()) : 1;
  }
  std::erase_if(forked, [](const std::unique_ptr<Active>& b) { return b->seq->done; });
}

int64_t Engine::prefill_step(std::vector<std::unique_ptr<Active>>& forked) {
  if (prefix_) return prefill_step_blocks(forked);
  const int64_t B = opt_.prefill_chunk;
  // Prefill, first come first served, at most B prompt tokens this step: a prompt of at most B
  // tokens whole (if it fits what is left of the B), a longer one B tokens at a time from a fresh
  // budget (so its chunks are always the same: prefill_chunked's). Every piece's table rows go to
  // the prefetch thread first, so later pieces' pages load during earlier ones.
  struct Piece {
    Active* a;
    int64_t n;
  };
  std::vector<Piece> pieces;
  int64_t left = B;
  for (auto& a : prefilling_) {
    const int64_t P = static_cast<int64_t>(a->req.prompt.size());
    const int64_t n = P <= B ? (P <= left ? P : 0) : (left == B ? std::min(B, P - a->prefilled) : 0);
    if (n == 0) break;
    pieces.push_back({a.get(), n});
    left -= n;
  }
  int64_t prefetched = 0;
  for (const auto& p : pieces) prefetched += prefetch(p.a->req.prompt.data() + p.a->prefilled, p.n);
  for (const auto& p : pieces) prefill_piece(*p.a, p.n, forked);
  return prefetched;
}

// Frees sequences whose caller left (or saw its stop string) before spending a step on them, then
// admits waiting requests (mu_ held).
void Engine::admit() {
  // A request whose choices are not split yet goes as a whole (the caller cancels them together).
  auto cancelled = [&](std::unique_ptr<Active>& a) {
    if (!a->seq->cancel.load()) return false;
    finish_all(*a, "cancelled");
    stats_.requests_cancelled += 1 + static_cast<int64_t>(a->others.size());
    stats_.kv_tokens_used -= a->need;
    a.reset();
    return true;
  };
  for (auto& a : active_) cancelled(a);
  std::erase(active_, nullptr);
  for (auto& a : prefilling_) cancelled(a);
  std::erase(prefilling_, nullptr);
  // Admission: first come, first served, while the batch (a request takes one slot per choice)
  // and the KV budget allow.
  auto choices = [](const Active& a) { return 1 + static_cast<int64_t>(a.others.size()); };
  int64_t slots = static_cast<int64_t>(active_.size());
  for (const auto& a : prefilling_) slots += choices(*a);
  while (!waiting_.empty() && slots + choices(waiting_.front()) <= opt_.max_batch &&
         kv_fits(waiting_.front().need)) {
    auto a = std::make_unique<Active>(std::move(waiting_.front()));
    waiting_.pop_front();
    if (a->seq->cancel.load()) {
      finish_all(*a, "cancelled");
      stats_.requests_cancelled += choices(*a);
      continue;
    }
    slots += choices(*a);
    // Disk tables: the prompt's blocks read from now on, before its prefill. With prefix reuse only
    // the tokens it will prefill: a reused position's rows are never gathered (its keys and values
    // come from the stored block, and its logits are not asked for).
    if (opt_.prefetch) {
      const int64_t P = static_cast<int64_t>(a->req.prompt.size());
      a->announced_from = prefix_ && !a->req.prompt_logprobs ? prefix_->match_tokens(a->req.prompt.data(), P - 1) : 0;
      prefetch_disk_rows(model_, a->req.prompt.data() + a->announced_from, P - a->announced_from);
    }
    stats_.kv_tokens_used += a->need;
    stats_.requests_admitted += choices(*a);
    prefilling_.push_back(std::move(a));
  }
  stats_.queue_depth = static_cast<int64_t>(waiting_.size());
}

void Engine::decode_running(std::vector<std::unique_ptr<Active>>& running, bool partly_prefilled) {
  const int64_t M = static_cast<int64_t>(running.size());
  if (M == 0) return;
  std::vector<int64_t> handles;
  std::vector<int32_t> tokens;
  std::vector<PickRequest> req;
  for (auto& a : running) {
    handles.push_back(a->kv.id());
    tokens.push_back(a->last);
    req.push_back(pick_request(a->req, a->rng));
  }
  std::vector<TokenPick> picks(static_cast<size_t>(M));
  int64_t rows = 0;
  const int64_t announced = prefetch(tokens.data(), M);  // fetched while the first layers compute
  std::string err;
  try {
    rows = decoder_->decode_pick(handles.data(), tokens.data(), M, req.data(), picks.data());
  } catch (const DeviceLost& e) {
    lose_device(e.what());
    err = e.what();
  } catch (const std::exception& e) {
    err = e.what();
  }
  int64_t produced = 0, finished = 0, freed = 0;
  for (int64_t i = 0; i < M; ++i) {
    Active& a = *running[i];
    const int64_t before = a.produced;
    bool go_on = false;
    if (err.empty()) go_on = emit_pick(a, std::move(picks[static_cast<size_t>(i)]));
    else finish(a, "error", err);
    produced += a.produced - before;
    if (!go_on) {
      finished++;
      freed += a.need;
      running[i].reset();
    }
  }
  std::erase(running, nullptr);
  std::lock_guard<std::mutex> lk(mu_);
  stats_.decode_steps++;
  if (partly_prefilled) stats_.decode_steps_during_prefill++;
  stats_.decode_batch_sum += M;
  stats_.batch_hist[M >= 32 ? 5 : M >= 16 ? 4 : M >= 8 ? 3 : M >= 4 ? 2 : M >= 2 ? 1 : 0]++;
  stats_.table_rows_read += rows;
  stats_.table_rows_prefetched += announced;
  stats_.generated_tokens += produced;
  stats_.requests_finished += finished;
  stats_.kv_tokens_used -= freed;
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] {
        return stop_ || !lost_.empty() || (!paused_ && (!waiting_.empty() || !active_.empty() || !prefilling_.empty()));
      });
      if (!lost_.empty()) end_after_loss();
      if (stop_ || !lost_.empty()) return;
      admit();
    }
    std::vector<std::unique_ptr<Active>> forked;  // choices 2..n of prompts completed this step
    const int64_t prefetched = prefill_step(forked);
    std::vector<std::unique_ptr<Active>> running;
    bool partly_prefilled = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      // Fully prefilled prompts leave prefilling_: into the decode batch, or gone (finished).
      for (auto& a : prefilling_) {
        if (a->prefilled < static_cast<int64_t>(a->req.prompt.size()) && !a->seq->done) {
          partly_prefilled = partly_prefilled || a->prefilled > 0;
          continue;
        }
        if (!a->seq->done) active_.push_back(std::move(a));
        else a.reset();
      }
      std::erase(prefilling_, nullptr);
      for (auto& a : forked) active_.push_back(std::move(a));
      stats_.prefilling = static_cast<int64_t>(prefilling_.size());
      stats_.active = static_cast<int64_t>(active_.size());
      stats_.table_rows_prefetched += prefetched;
      running.swap(active_);  // the scheduler owns them during the step; submit() only touches waiting_
    }
    decode_running(running, partly_prefilled);
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& a : running) active_.push_back(std::move(a));
    stats_.active = static_cast<int64_t>(active_.size());
  }
}

}  // namespace jtok
