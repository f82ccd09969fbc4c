#include "serve/http_api.h"

#include <httplib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/error.h"
#include "serve/completion_request.h"

namespace jtok {

namespace {

using json = nlohmann::json;

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// The longest prefix of s[0, n) that does not end inside a UTF-8 character (a token may carry half
// of one; the rest comes with the next token).
size_t utf8_complete(const std::string& s, size_t n) {
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > back ? n - back : n;
  }
  return n;
}

// Turns a sequence's tokens into text as they come: holds back a partial UTF-8 character and any
// tail that may begin a stop sequence; cuts at the first stop sequence.
struct TextTracker {
  const Tokenizer& tok;
  const std::vector<std::string>& stops;
  size_t sent = 0;       // bytes of text already handed out
  bool stopped = false;  // a stop sequence was seen
  // Returns the new text that may be sent now; `done`: the sequence has ended.
  std::string advance(const std::vector<int32_t>& tokens, bool done) {
    std::string text = tok.decode(tokens);
    size_t end = text.size();
    size_t cut = std::string::npos;
    for (const auto& s : stops) cut = std::min(cut, text.find(s));
    if (cut != std::string::npos) {
      stopped = true;
      end = cut;
    } else if (!done) {
      size_t hold = 0;
      for (const auto& s : stops) hold = std::max(hold, s.size() - 1);
      end = end > hold ? end - hold : 0;
      end = utf8_complete(text, end);
    }
    if (end <= sent) return {};
    std::string out = text.substr(sent, end - sent);
    sent = end;
    return out;
  }
};

// Prompts are encoded on one thread: the BPE keeps a 6 MB piece cache per calling thread
// (src/data/bpe.cpp), and encoding on each of ~100 connection threads grew the resident memory by
// ~600 MB under a 64-client load (measured).
class EncodeThread {
 public:
  explicit EncodeThread(const Tokenizer& tok) : tok_(tok), thread_([this] { loop(); }) {}
  ~EncodeThread() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  std::vector<int32_t> encode(const std::string& text) {
    std::packaged_task<std::vector<int32_t>()> task([&] { return tok_.encode(text); });
    auto result = task.get_future();
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    return result.get();  // rethrows what encode threw
  }

 private:
  void loop() {
    for (;;) {
      std::packaged_task<std::vector<int32_t>()> task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }
  const Tokenizer& tok_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<std::vector<int32_t>()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct HttpApi::Impl {
  Engine& engine;
  const Tokenizer& tok;
  ServeOptions opt;
  httplib::Server svr;
  EncodeThread encoder{tok};
  std::atomic<int64_t> next_id{1};
  std::mutex metrics_mu;
  std::map<std::pair<std::string, int>, int64_t> responses;  // (route, status) -> count
  std::atomic<int64_t> streams_open{0};
  std::vector<double> latency_bounds{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  std::vector<int64_t> latency_counts = std::vector<int64_t>(10, 0);
  double latency_sum = 0;
  int64_t latency_n = 0;

  Impl(Engine& e, const Tokenizer& t, ServeOptions o) : engine(e), tok(t), opt(std::move(o)) {}

  void count(const std::string& route, int status) {
    std::lock_guard<std::mutex> lk(metrics_mu);
    responses[{route, status}]++;
  }
  void observe_latency(double s) {
    std::lock_guard<std::mutex> lk(metrics_mu);
    size_t b = 0;
    while (b < latency_bounds.size() && s > latency_bounds[b]) ++b;
    latency_counts[b]++;
    latency_sum += s;
    latency_n++;
  }

  // Metrics label of a path: the routes we serve, everything else "other" (bounded label values).
  static std::string route_label(const std::string& path) {
    for (const char* r : {"/v1/completions", "/v1/models", "/health", "/metrics"})
      if (path == r) return r;
    return "other";
  }

  void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(dump(error_body(e)), "application/json");
  }

  bool authorized(const httplib::Request& req, httplib::Response& res) {
    if (opt.api_key.empty()) return true;
    const std::string h = req.get_header_value("Authorization");
    if (h == "Bearer " + opt.api_key) return true;
    ApiError e{401, h.empty() ? "missing API key: send the header 'Authorization: Bearer <key>'"
                              : "incorrect API key provided",
               "invalid_request_error", "", "invalid_api_key"};
    send_error(res, e);
    return false;
  }

  json completion_chunk(const std::string& id, int64_t created, const std::string& text, const json& finish) {
    return {{"id", id},
            {"object", "text_completion"},
            {"created", created},
            {"model", opt.model_id},
            {"choices", json::array({{{"text", text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}}})}};
  }

  static json usage(int64_t prompt, int64_t completion) {
    return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
  }

  void completions(const httplib::Request& req, httplib::Response& res) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!authorized(req, res)) return count("/v1/completions", res.status);
    CompletionRequest p;
    std::shared_ptr<Sequence> seq;
    try {
      auto parsed = parse_completion_request(req.body, {opt.model_id, static_cast<int64_t>(tok.vocab_size()), tok.eot_id()},
                                             [this](const std::string& s) { return encoder.encode(s); });
      if (auto* e = std::get_if<ApiError>(&parsed)) throw *e;
      p = std::get<CompletionRequest>(std::move(parsed));
      GenerationRequest g;
      g.prompt = p.prompt;
      g.max_tokens = p.max_tokens;
      g.sampling = p.sampling;
      g.seed = p.seed;
      g.stop_token = p.ignore_eos ? -1 : tok.eot_id();
      try {
        seq = engine.submit(std::move(g));
      } catch (const Error& e) {
        throw ApiError{400, e.what(), "invalid_request_error",
                       p.prompt.size() + p.max_tokens > static_cast<size_t>(engine.options().ctx) ? "max_tokens" : "prompt",
                       "context_length_exceeded"};
      }
      if (!seq) {
        res.set_header("Retry-After", "1");
        throw ApiError{429, "the server is at capacity (every batch slot busy and the queue full); retry later",
                       "server_busy", "", "rate_limit_exceeded"};
      }
    } catch (const ApiError& e) {
      send_error(res, e);
      return count("/v1/completions", res.status);
    }
    const std::string id = "cmpl-" + std::to_string(next_id++);
    const int64_t created = unix_time();
    const int64_t P = static_cast<int64_t>(p.prompt.size());
    if (!p.stream) {
      TextTracker tt{tok, p.stop};
      std::vector<int32_t> tokens;
      std::string reason;
      std::string text;
      {
        std::unique_lock<std::mutex> lk(seq->mu);
        for (;;) {
          seq->cv.wait(lk, [&] { return seq->done || seq->tokens.size() > tokens.size(); });
          tokens = seq->tokens;
          const bool done = seq->done;
          reason = seq->finish_reason;
          if (!p.stop.empty() && !done) {  // a stop sequence ends the request early
            lk.unlock();
            text += tt.advance(tokens, false);
            lk.lock();
            if (tt.stopped) {
              seq->cancel = true;
              reason = "stop";
              break;
            }
          }
          if (done) break;
        }
        if (reason == "error") {
          send_error(res, ApiError{500, "generation failed: " + seq->error, "server_error", "", ""});
          return count("/v1/completions", res.status);
        }
      }
      if (!tt.stopped) text += tt.advance(tokens, true);
      if (tt.stopped) reason = "stop";
      json out = completion_chunk(id, created, text, reason);
      out["usage"] = usage(P, static_cast<int64_t>(tokens.size()));
      res.set_content(dump(out), "application/json");
      count("/v1/completions", 200);
      observe_latency(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      return;
    }
    // Streaming: server-sent events, one per piece of text, then the finish, usage, [DONE].
    count("/v1/completions", 200);
    streams_open++;
    auto stops = std::make_shared<std::vector<std::string>>(p.stop);  // outlives this handler
    auto tt = std::make_shared<TextTracker>(TextTracker{tok, *stops});
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, seq, tt, stops, id, created, P, include_usage = p.include_usage, t0](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& j) {
            const std::string ev = "data: " + dump(j) + "\n\n";
            return sink.write(ev.data(), ev.size());
          };
          std::vector<int32_t> tokens;
          for (;;) {
            bool done;
            std::string reason, error;
            {
              std::unique_lock<std::mutex> lk(seq->mu);
              seq->cv.wait_for(lk, std::chrono::milliseconds(200),
                               [&] { return seq->done || seq->tokens.size() > tokens.size(); });
              tokens = seq->tokens;
              done = seq->done;
              reason = seq->finish_reason;
              error = seq->error;
            }
            if (!sink.is_writable()) {
              seq->cancel = true;  // the client left: free its sequence before the next step
              return false;
            }
            std::string piece = tt->advance(tokens, done);
            if (tt->stopped) {
              seq->cancel = true;
              done = true;
              reason = "stop";
            }
            if (!piece.empty() && !send(completion_chunk(id, created, piece, nullptr))) {
              seq->cancel = true;
              return false;
            }
            if (!done) continue;
            if (reason == "error") {
              send(error_body(ApiError{500, "generation failed: " + error, "server_error", "", ""}));
            } else {
              json fin = completion_chunk(id, created, "", reason);
              if (include_usage) fin["usage"] = usage(P, static_cast<int64_t>(tokens.size()));
              send(fin);
            }
            const std::string end = "data: [DONE]\n\n";
            sink.write(end.data(), end.size());
            sink.done();
            observe_latency(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            return true;
          }
        },
        [this, seq](bool success) {
          if (!success) seq->cancel = true;
          streams_open--;
        });
  }

  std::string metrics_text() {
    const EngineStats s = engine.stats();
    std::ostringstream o;
    auto counter = [&](const char* name, const char* help, int64_t v, const char* type = "counter") {
      o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << " " << v << "\n";
    };
    {
      std::lock_guard<std::mutex> lk(metrics_mu);
      o << "# HELP jtok_http_responses_total HTTP responses by route and status\n# TYPE jtok_http_responses_total counter\n";
      for (const auto& [k, v] : responses)
        o << "jtok_http_responses_total{route=\"" << k.first << "\",status=\"" << k.second << "\"} " << v << "\n";
      o << "# HELP jtok_request_seconds completion latency (whole request)\n# TYPE jtok_request_seconds histogram\n";
      int64_t cum = 0;
      for (size_t b = 0; b < latency_bounds.size(); ++b) {
        cum += latency_counts[b];
        o << "jtok_request_seconds_bucket{le=\"" << latency_bounds[b] << "\"} " << cum << "\n";
      }
      o << "jtok_request_seconds_bucket{le=\"+Inf\"} " << latency_n << "\n";
      o << "jtok_request_seconds_sum " << latency_sum << "\njtok_request_seconds_count " << latency_n << "\n";
    }
    counter("jtok_requests_admitted_total", "requests admitted to a batch", s.requests_admitted);
    counter("jtok_requests_finished_total", "requests finished (length, stop or error)", s.requests_finished);
    counter("jtok_requests_refused_total", "requests refused with 429 (queue full)", s.requests_refused);
    counter("jtok_requests_cancelled_total", "requests cancelled (client gone, stop sequence)", s.requests_cancelled);
    counter("jtok_prompt_tokens_total", "prompt tokens prefilled", s.prompt_tokens);
    counter("jtok_generated_tokens_total", "tokens generated", s.generated_tokens);
    counter("jtok_prefills_total", "prompts prefilled", s.prefills);
    counter("jtok_prefill_chunks_total", "prompt pieces computed (--prefill-chunk tokens at most; a short prompt is one)",
            s.prefill_chunks);
    counter("jtok_decode_steps_during_prefill_total", "decode steps run while a long prompt was partly prefilled",
            s.decode_steps_during_prefill);
    counter("jtok_prefilling_sequences", "admitted prompts not fully prefilled yet", s.prefilling, "gauge");
    counter("jtok_decode_steps_total", "batched decode steps", s.decode_steps);
    counter("jtok_decode_sequences_total", "sequences over all decode steps (mean batch = this / steps)",
            s.decode_batch_sum);
    o << "# HELP jtok_decode_batch_size decode steps by batch size M\n# TYPE jtok_decode_batch_size histogram\n";
    const char* le[] = {"1", "3", "7", "15", "31", "+Inf"};
    int64_t cum = 0;
    for (int b = 0; b < 6; ++b) o << "jtok_decode_batch_size_bucket{le=\"" << le[b] << "\"} " << (cum += s.batch_hist[b]) << "\n";
    o << "jtok_decode_batch_size_sum " << s.decode_batch_sum << "\njtok_decode_batch_size_count " << s.decode_steps << "\n";
    counter("jtok_table_rows_read_total", "token-table rows read by decode steps", s.table_rows_read);
    counter("jtok_table_rows_prefetched_total", "token-table rows handed to the prefetch thread before use (mmap tables)",
            s.table_rows_prefetched);
    counter("jtok_prefetch_pages_total", "pages of table rows touched by the prefetch thread", s.prefetch_pages);
    counter("jtok_prefetch_major_faults_total", "major page faults taken by the prefetch thread (off the compute thread)",
            s.prefetch_major_faults);
    counter("jtok_prefetch_jobs_dropped_total", "prefetch jobs dropped unstarted (the thread fell behind the steps)",
            s.prefetch_dropped);
    counter("jtok_queue_depth", "requests waiting for admission", s.queue_depth, "gauge");
    counter("jtok_active_sequences", "sequences in the decode batch", s.active, "gauge");
    counter("jtok_kv_tokens_used", "KV-cache token slots reserved", s.kv_tokens_used, "gauge");
    counter("jtok_kv_tokens_budget", "KV-cache token slots available", engine.options().kv_budget_tokens, "gauge");
    counter("jtok_streams_open", "server-sent event streams open", streams_open.load(), "gauge");
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    counter("jtok_page_faults_major_total", "major page faults of the process (pages read from disk)", ru.ru_majflt);
    counter("jtok_page_faults_minor_total", "minor page faults of the process", ru.ru_minflt);
    long pages = 0, resident = 0;
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
      std::fclose(f);
    }
    counter("jtok_resident_bytes", "resident memory of the process", static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE),
            "gauge");
    o << "# HELP jtok_tables_info where the token tables live\n# TYPE jtok_tables_info gauge\njtok_tables_info{tables=\""
      << opt.tables << "\"} 1\n";
    return o.str();
  }

  void setup() {
    svr.new_task_queue = [n = opt.http_threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
    svr.set_payload_max_length(opt.max_body_bytes);
    svr.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { completions(q, r); });
    svr.Get("/v1/models", [this](const httplib::Request& q, httplib::Response& r) {
      if (authorized(q, r))
        r.set_content(dump({{"object", "list"},
                            {"data", json::array({{{"id", opt.model_id},
                                                   {"object", "model"},
                                                   {"created", 0},
                                                   {"owned_by", "jtok"}}})}}),
                      "application/json");
      count("/v1/models", r.status == -1 ? 200 : r.status);
    });
    svr.Get("/health", [](const httplib::Request&, httplib::Response& r) {
      r.set_content("{\"status\":\"ok\"}", "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
      r.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    // Anything else that ends in 4xx/5xx without a body of ours (unknown route, body too large,
    // wrong method): an OpenAI-style body too.
    svr.set_error_handler([this](const httplib::Request& q, httplib::Response& r) {
      if (!r.body.empty()) return;
      std::string msg = r.status == 413   ? "the request body is larger than " + std::to_string(opt.max_body_bytes) + " bytes"
                        : r.status == 404 ? "no route " + q.method + " " + q.path
                                          : "request failed with HTTP status " + std::to_string(r.status);
      send_error(r, ApiError{r.status, msg, "invalid_request_error", "", ""});
      count(route_label(q.path), r.status);
    });
    svr.set_exception_handler([this](const httplib::Request& q, httplib::Response& r, std::exception_ptr ep) {
      std::string msg = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        msg = e.what();
      } catch (...) {
      }
      send_error(r, ApiError{500, msg, "server_error", "", ""});
      count(route_label(q.path), 500);
    });
  }
};

HttpApi::HttpApi(Engine& engine, const Tokenizer& tokenizer, ServeOptions opt)
    : impl_(std::make_unique<Impl>(engine, tokenizer, std::move(opt))) {
  impl_->setup();
}

HttpApi::~HttpApi() = default;

void HttpApi::run(const std::function<void(int)>& on_listen) {
  auto& s = impl_->svr;
  int port = impl_->opt.port;
  if (port == 0) {
    port = s.bind_to_any_port(impl_->opt.host);
    if (port < 0) fail("cannot bind ", impl_->opt.host, " to any port");
  } else if (!s.bind_to_port(impl_->opt.host, port)) {
    fail("cannot bind ", impl_->opt.host, ":", port, " (in use, or not an address of this machine?)");
  }
  if (on_listen) on_listen(port);
  if (!s.listen_after_bind()) fail("the HTTP server on ", impl_->opt.host, ":", port, " stopped with an error");
}

void HttpApi::stop() { impl_->svr.stop(); }

}  // namespace jtok
