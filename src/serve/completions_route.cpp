#include "serve/completions_route.h"

#include <httplib.h>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <numeric>

#include "core/error.h"
#include "serve/api_json.h"
#include "serve/completion_reply.h"
#include "serve/completion_request.h"
#include "serve/text_stream.h"

namespace jtok {

namespace {

using json = nlohmann::json;

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump_json(error_body(e)), "application/json");
}

json choice_json(const std::string& text, size_t index, json logprobs, const json& finish) {
  return {{"text", text}, {"index", index}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish}};
}

// Chat's choice: the whole message, or (streamed) a delta of its content.
json chat_choice_json(const std::string& text, size_t index, const json& finish, bool stream, bool first,
                      json logprobs = nullptr) {
  json msg = json::object();
  if (!stream || first) msg["role"] = "assistant";
  if (!stream || !text.empty() || first) msg["content"] = text;
  return {{"index", index}, {stream ? "delta" : "message", std::move(msg)}, {"logprobs", std::move(logprobs)},
          {"finish_reason", finish}};
}

// The prompt's cost as the engine measured it (set with the first choice's first token, shared by
// the choices): OpenAI's usage with prompt_tokens_details.cached_tokens (the tokens taken from stored
// prefix blocks), and llama.cpp's timings names: cache_n, prompt_n (tokens computed), prompt_ms
// (the scheduler's time on this prompt: copying the blocks in, prefilling the rest).
struct PromptCost {
  int64_t tokens = 0, cached = 0;
  double ms = 0;
};

PromptCost prompt_cost(Sequence& s, int64_t prompt_tokens) {
  std::lock_guard<std::mutex> lk(s.mu);
  return {prompt_tokens, s.cached_tokens, s.prefill_ms};
}

json usage(const PromptCost& p, int64_t completion) {
  return {{"prompt_tokens", p.tokens},
          {"completion_tokens", completion},
          {"total_tokens", p.tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", p.cached}}}};
}

json timings(const PromptCost& p) {
  return {{"cache_n", p.cached}, {"prompt_n", p.tokens - p.cached}, {"prompt_ms", p.ms}};
}

// One choice once it has ended (or seen a stop sequence, which cancels it).
struct ChoiceOut {
  std::string text;  // the completion's text, cut at the first stop sequence
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> lps, prompt_lps;
  std::string reason, error;
  bool stopped = false;
};

ChoiceOut collect(Sequence& seq, const Tokenizer& tok, const std::vector<std::string>& stops) {
  TextTracker tt{tok, stops};
  ChoiceOut c;
  std::unique_lock<std::mutex> lk(seq.mu);
  for (;;) {
    seq.cv.wait(lk, [&] { return seq.done || seq.tokens.size() > c.tokens.size(); });
    c.tokens = seq.tokens;
    const bool done = seq.done;
    c.reason = seq.finish_reason;
    if (!stops.empty() && !done) {  // a stop sequence ends the choice early
      lk.unlock();
      c.text += tt.advance(c.tokens, false);
      lk.lock();
      if (tt.stopped) {
        seq.cancel = true;
        break;
      }
    }
    if (done) break;
  }
  c.lps.assign(seq.logprobs.begin(), seq.logprobs.begin() + static_cast<std::ptrdiff_t>(
                                                               std::min(seq.logprobs.size(), c.tokens.size())));
  c.prompt_lps = seq.prompt_logprobs;
  c.error = seq.error;
  lk.unlock();
  if (!tt.stopped) c.text += tt.advance(c.tokens, true);
  if (tt.stopped) c.reason = "stop";
  c.stopped = tt.stopped;
  return c;
}

// The choice's tokens that the reply shows: all of them, or after a stop sequence those whose text
// begins before the cut.
size_t shown_tokens(const Tokenizer& tok, const ChoiceOut& c) {
  if (!c.stopped) return c.tokens.size();
  size_t off = 0, k = 0;
  for (; k < c.tokens.size() && off < c.text.size(); ++k) off += tok.decode({c.tokens[k]}).size();
  return k;
}

json choice_logprobs(const Tokenizer& tok, const CompletionRequest& p, const ChoiceOut& c) {
  LogprobsBuilder b(tok, p.chat);
  if (p.echo) {
    b.add_unscored(p.prompt[0]);
    for (const auto& e : c.prompt_lps) b.add(e);
  }
  const size_t k = std::min(shown_tokens(tok, c), c.lps.size());
  for (size_t j = 0; j < k; ++j) b.add(c.lps[j]);
  return b.take();
}

}  // namespace

namespace {

struct Reply {
  std::string id;
  int64_t created;
  std::chrono::steady_clock::time_point t0;
};

json chunk(const CompletionsRoute& r, const Reply& rep, json choices, bool stream = false) {
  const char* object = !r.chat ? "text_completion" : stream ? "chat.completion.chunk" : "chat.completion";
  return {{"id", rep.id}, {"object", object}, {"created", rep.created}, {"model", r.model_id},
          {"choices", std::move(choices)}};
}

// The whole reply: every choice waited for, the n best of best_of by total log-prob of their shown
// tokens (in that order), usage over all best_of.
void reply_whole(CompletionsRoute& r, const CompletionRequest& p, const std::vector<std::shared_ptr<Sequence>>& seqs,
                 const Reply& rep, httplib::Response& res) {
  std::vector<ChoiceOut> outs;
  int64_t completion_tokens = 0;
  for (const auto& s : seqs) {
    outs.push_back(collect(*s, r.tok, p.stop));
    completion_tokens += static_cast<int64_t>(outs.back().tokens.size());
    if (outs.back().reason == "error") {
      for (const auto& o : seqs) o->cancel = true;
      send_error(res, ApiError{500, "generation failed: " + outs.back().error, "server_error", "", ""});
      return r.count(res.status);
    }
  }
  std::vector<size_t> order(static_cast<size_t>(p.n));
  std::iota(order.begin(), order.end(), 0);
  if (p.best_of > p.n) {
    std::vector<double> totals;
    for (const auto& c : outs) {
      const size_t k = std::min(shown_tokens(r.tok, c), c.lps.size());
      totals.push_back(std::accumulate(c.lps.begin(), c.lps.begin() + static_cast<std::ptrdiff_t>(k), 0.0,
                                       [](double s, const TokenLogprob& e) { return s + e.logprob; }));
    }
    order = best_choices(totals, static_cast<size_t>(p.n));
  }
  const std::string echo = p.echo ? r.tok.decode(p.prompt) : std::string();
  json choices = json::array();
  for (size_t k = 0; k < order.size(); ++k) {
    const ChoiceOut& c = outs[order[k]];
    if (p.chat)
      choices.push_back(chat_choice_json(c.text, k, c.reason, false, false,
                                         p.logprobs >= 0 ? choice_logprobs(r.tok, p, c) : json(nullptr)));
    else choices.push_back(choice_json(echo + c.text, k, p.logprobs >= 0 ? choice_logprobs(r.tok, p, c) : json(nullptr),
                                       c.reason));
  }
  json out = chunk(r, rep, std::move(choices));
  const PromptCost cost = prompt_cost(*seqs[0], static_cast<int64_t>(p.prompt.size()));
  out["usage"] = usage(cost, completion_tokens);
  out["timings"] = timings(cost);
  res.set_content(dump_json(out), "application/json");
  r.count(200);
  r.observe_latency(seconds_since(rep.t0));
}

// A streamed choice: what has been sent of it so far.
struct StreamChoice {
  std::shared_ptr<Sequence> seq;
  TextTracker tt;
  LogprobsBuilder lb;
  size_t base = 0;       // bytes of echoed prompt text before the completion's
  size_t tokens_seen = 0, lp_seen = 0;
  std::deque<TokenLogprob> pending;  // log-probs of tokens whose text is not sent yet
  bool started = false, finished = false;
};

struct StreamState {
  CompletionRequest p;
  std::string prompt_text;
  std::deque<StreamChoice> ch;
  int64_t completion_tokens = 0;
};

// What a choice has new, taken under its lock. False when nothing is new (or its prompt is not
// through yet).
struct Snapshot {
  std::vector<int32_t> tokens;
  bool done = false;
  std::string reason, error;
  std::vector<TokenLogprob> prompt_lps;  // until the choice has started
};

bool take_snapshot(StreamChoice& c, Snapshot& s) {
  std::lock_guard<std::mutex> lk(c.seq->mu);
  if (c.seq->tokens.size() == c.tokens_seen && !c.seq->done && c.started) return false;
  if (!c.seq->done && c.seq->tokens.empty()) return false;
  s.tokens = c.seq->tokens;
  s.done = c.seq->done;
  s.reason = c.seq->finish_reason;
  s.error = c.seq->error;
  for (; c.lp_seen < std::min(c.seq->logprobs.size(), s.tokens.size()); ++c.lp_seen)
    c.pending.push_back(c.seq->logprobs[c.lp_seen]);
  if (!c.started) s.prompt_lps = c.seq->prompt_logprobs;
  c.tokens_seen = s.tokens.size();
  return true;
}

using Send = std::function<bool(const json&)>;

// Sends choice i's news: the echoed prompt first, then the new text with the log-probs of the tokens
// it begins, then its finish (with usage when it is the last to finish). False when the client is gone.
bool send_choice(CompletionsRoute& r, StreamState& st, const Reply& rep, size_t i, Snapshot& s, const Send& send) {
  const CompletionRequest& p = st.p;
  StreamChoice& c = st.ch[i];
  auto event = [&](const std::string& text, const json& finish) {
    if (p.chat) {
      json lp = p.logprobs >= 0 && finish.is_null() && !c.lb.empty() ? c.lb.take() : json(nullptr);
      return send(chunk(r, rep, json::array({chat_choice_json(text, i, finish, true, !c.started, std::move(lp))}), true));
    }
    return send(chunk(r, rep, json::array({choice_json(text, i, p.logprobs >= 0 && finish.is_null() ? c.lb.take() : json(nullptr), finish)})));
  };
  if (!c.started) {
    if (p.chat && !event("", nullptr)) return false;  // the role first, as OpenAI's streams begin
    c.started = true;
    if (p.echo) {
      if (p.logprobs >= 0) {
        c.lb.add_unscored(p.prompt[0]);
        for (const auto& e : s.prompt_lps) c.lb.add(e);
      }
      c.base = st.prompt_text.size();
      if (!event(st.prompt_text, nullptr)) return false;
    }
  }
  const std::string piece = c.tt.advance(s.tokens, s.done);
  if (c.tt.stopped) {
    c.seq->cancel = true;
    s.done = true;
    s.reason = "stop";
  }
  while (!c.pending.empty() && (c.lb.offset() < c.base + c.tt.sent || (s.done && !c.tt.stopped))) {
    c.lb.add(c.pending.front());
    c.pending.pop_front();
  }
  if ((!piece.empty() || !c.lb.empty()) && !event(piece, nullptr)) return false;
  if (!s.done) return true;
  c.finished = true;
  st.completion_tokens += static_cast<int64_t>(s.tokens.size());
  json fin = p.chat ? chunk(r, rep, json::array({chat_choice_json("", i, s.reason, true, false)}), true)
                    : chunk(r, rep, json::array({choice_json("", i, nullptr, s.reason)}));
  bool last = true;
  for (const auto& o : st.ch) last = last && o.finished;
  if (!(last && p.include_usage)) return send(fin);
  const PromptCost cost = prompt_cost(*st.ch[0].seq, static_cast<int64_t>(p.prompt.size()));
  if (!p.chat) {
    fin["usage"] = usage(cost, st.completion_tokens);
    fin["timings"] = timings(cost);
    return send(fin);
  }
  json tail = chunk(r, rep, json::array(), true);  // chat: usage in a last chunk of no choices, as OpenAI's
  tail["usage"] = usage(cost, st.completion_tokens);
  tail["timings"] = timings(cost);
  return send(fin) && send(tail);
}

// One pass over the choices: sends what each has new. Returns false when the client is gone;
// progressed: something was new; failed: generation failed (its error event sent).
bool stream_pass(CompletionsRoute& r, StreamState& st, const Reply& rep, httplib::DataSink& sink, bool& progressed,
                 bool& failed) {
  const Send send = [&](const json& j) {
    const std::string ev = "data: " + dump_json(j) + "\n\n";
    return sink.write(ev.data(), ev.size());
  };
  for (size_t i = 0; i < st.ch.size(); ++i) {
    Snapshot s;
    if (st.ch[i].finished || !take_snapshot(st.ch[i], s)) continue;
    progressed = true;
    if (s.reason == "error") {
      send(error_body(ApiError{500, "generation failed: " + s.error, "server_error", "", ""}));
      failed = true;
      return true;
    }
    if (!send_choice(r, st, rep, i, s, send)) return false;
  }
  return true;
}

void reply_stream(CompletionsRoute& r, const CompletionRequest& p, const std::vector<std::shared_ptr<Sequence>>& seqs,
                  const Reply& rep, httplib::Response& res) {
  r.count(200);
  r.streams_open++;
  auto st = std::make_shared<StreamState>();
  st->p = p;
  st->prompt_text = p.echo ? r.tok.decode(p.prompt) : std::string();
  for (const auto& s : seqs) st->ch.push_back(StreamChoice{s, TextTracker{r.tok, st->p.stop}, LogprobsBuilder(r.tok, p.chat), 0, 0, 0, {}});
  res.set_header("Cache-Control", "no-cache");
  auto cancel_all = [st] {
    for (auto& c : st->ch) c.seq->cancel = true;
  };
  res.set_chunked_content_provider(
      "text/event-stream",
      [&r, st, rep, cancel_all](size_t, httplib::DataSink& sink) {
        for (;;) {
          if (!sink.is_writable()) {
            cancel_all();  // the client left: free its sequences before the next step
            return false;
          }
          bool progressed = false, failed = false;
          if (!stream_pass(r, *st, rep, sink, progressed, failed)) {
            cancel_all();
            return false;
          }
          bool all = true;
          for (const auto& c : st->ch) all = all && c.finished;
          if (failed || all) {
            if (failed) cancel_all();
            const std::string end = "data: [DONE]\n\n";
            sink.write(end.data(), end.size());
            sink.done();
            r.observe_latency(seconds_since(rep.t0));
            return true;
          }
          if (progressed) continue;
          for (auto& c : st->ch) {  // wait for the first unfinished choice to move
            if (c.finished) continue;
            std::unique_lock<std::mutex> lk(c.seq->mu);
            c.seq->cv.wait_for(lk, std::chrono::milliseconds(200),
                               [&] { return c.seq->done || c.seq->tokens.size() > c.tokens_seen; });
            break;
          }
        }
      },
      [&r, cancel_all](bool success) {
        if (!success) cancel_all();
        r.streams_open--;
      });
}

// The engine's request for a parsed one: best_of choices, log-probs for the client or for ranking.
GenerationRequest generation_request(const CompletionRequest& p, int32_t eot, const std::vector<int32_t>& end_of_turn) {
  GenerationRequest g;
  g.prompt = p.prompt;
  g.max_tokens = p.max_tokens;
  g.sampling = p.sampling;
  g.seed = p.seed;
  if (!p.ignore_eos) g.stop_tokens = {eot};
  if (p.chat) g.stop_tokens.insert(g.stop_tokens.end(), end_of_turn.begin(), end_of_turn.end());
  g.n = p.best_of;
  g.top_logprobs = p.logprobs >= 0 ? p.logprobs : p.best_of > p.n ? 0 : -1;
  g.prompt_logprobs = p.echo && p.logprobs >= 0;
  return g;
}

}  // namespace

void CompletionsRoute::handle(const httplib::Request& req, httplib::Response& res) {
  const Reply rep{(chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++), unix_time(), std::chrono::steady_clock::now()};
  CompletionRequest p;
  std::vector<std::shared_ptr<Sequence>> seqs;
  try {
    if (chat && !render) throw ApiError{400, no_template_reason, "invalid_request_error", "messages", "no_chat_template"};
    const CompletionLimits lim{model_id, static_cast<int64_t>(tok.vocab_size()), tok.eot_id(), max_n};
    auto parsed = chat ? parse_chat_request(req.body, lim, render) : parse_completion_request(req.body, lim, encode);
    if (auto* e = std::get_if<ApiError>(&parsed)) throw *e;
    p = std::get<CompletionRequest>(std::move(parsed));
    const int64_t P = static_cast<int64_t>(p.prompt.size());
    if (p.max_tokens < 0) p.max_tokens = std::max<int64_t>(1, engine.options().ctx - P);  // chat: to the context's end
    try {
      seqs = engine.submit_choices(generation_request(p, tok.eot_id(), end_of_turn));
    } catch (const DeviceLost& e) {
      throw ApiError{503, e.what(), "server_error", "", "device_lost"};
    } catch (const Error& e) {
      const bool ctx = p.max_tokens > engine.options().ctx - P;
      const char* param = ctx ? "max_tokens" : p.best_of > p.n ? "best_of" : p.n > 1 ? "n" : "prompt";
      throw ApiError{400, e.what(), "invalid_request_error", param, ctx || p.best_of == 1 ? "context_length_exceeded" : ""};
    }
    if (seqs.empty()) {
      res.set_header("Retry-After", "1");
      throw ApiError{429, "the server is at capacity (every batch slot busy and the queue full); retry later",
                     "server_busy", "", "rate_limit_exceeded"};
    }
  } catch (const ApiError& e) {
    send_error(res, e);
    return count(res.status);
  }
  if (p.stream) reply_stream(*this, p, seqs, rep, res);
  else reply_whole(*this, p, seqs, rep, res);
}

}  // namespace jtok
