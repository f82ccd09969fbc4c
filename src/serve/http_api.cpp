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
#include <thread>

#include "core/error.h"
#include "serve/api_json.h"
#include "serve/chat_template.h"
#include "serve/completion_request.h"
#include "serve/completions_route.h"
#include "serve/encode_thread.h"

namespace jtok {

namespace {

using json = nlohmann::json;

// --tables disk: the store's cache and reads (TableStore::Stats) as Prometheus counters.
void table_store_metrics(std::ostringstream& o, const TableStore::Stats& t) {
  auto counter = [&](const char* name, const char* help, auto v) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n" << name << " " << v << "\n";
  };
  counter("jtok_table_store_hits_total", "table-store row lookups that found the token's block cached", t.hits);
  counter("jtok_table_store_waits_total", "table-store row lookups that waited for the block's read under way (read-ahead)",
          t.waits);
  counter("jtok_table_store_misses_total", "table-store row lookups that read the token's block themselves", t.misses);
  counter("jtok_table_store_reads_total", "token blocks read from the store file (pread)", t.reads);
  counter("jtok_table_store_read_bytes_total", "bytes read from the store file", t.bytes_read);
  counter("jtok_table_store_prefetch_reads_total", "token blocks read by the read-ahead I/O threads", t.prefetch_reads);
  counter("jtok_table_store_prefetch_queued_total", "token blocks queued for read-ahead (not cached when announced)",
          t.prefetch_queued);
  counter("jtok_table_store_prefetch_skipped_total", "token blocks not read ahead (more than half the cache in one call)",
          t.prefetch_skipped);
  o << "# HELP jtok_table_store_read_seconds latency of the store's block reads\n# TYPE jtok_table_store_read_seconds summary\n"
    << "jtok_table_store_read_seconds_sum " << static_cast<double>(t.read_ns) * 1e-9 << "\n"
    << "jtok_table_store_read_seconds_count " << t.reads << "\n";
}

// One Prometheus metric: its HELP and TYPE lines and its value.
void metric(std::ostringstream& o, const char* name, const char* help, int64_t v, const char* type = "counter") {
  o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << " " << v << "\n";
}

// The engine's requests and prefills.
void request_metrics(std::ostringstream& o, const EngineStats& s) {
  metric(o, "jtok_requests_admitted_total", "requests admitted to a batch", s.requests_admitted);
  metric(o, "jtok_requests_finished_total", "requests finished (length, stop or error)", s.requests_finished);
  metric(o, "jtok_requests_refused_total", "requests refused with 429 (queue full)", s.requests_refused);
  metric(o, "jtok_requests_cancelled_total", "requests cancelled (client gone, stop sequence)", s.requests_cancelled);
  metric(o, "jtok_prompt_tokens_total", "prompt tokens prefilled", s.prompt_tokens);
  metric(o, "jtok_generated_tokens_total", "tokens generated", s.generated_tokens);
  metric(o, "jtok_prefills_total", "prompts prefilled", s.prefills);
  metric(o, "jtok_prefill_chunks_total", "prompt pieces computed (--prefill-chunk tokens at most; a short prompt is one)",
         s.prefill_chunks);
  metric(o, "jtok_decode_steps_during_prefill_total", "decode steps run while a long prompt was partly prefilled",
         s.decode_steps_during_prefill);
  metric(o, "jtok_choices_forked_total", "choices 2..n of requests, started from a copy of their prompt's KV cache",
         s.choices_forked);
  metric(o, "jtok_prompt_logprob_tokens_total", "prompt tokens scored for echo with logprobs", s.prompt_logprob_tokens);
  metric(o, "jtok_prefilling_sequences", "admitted prompts not fully prefilled yet", s.prefilling, "gauge");
}

// The decode steps (their batch sizes) and the table rows they read or had prefetched.
void decode_metrics(std::ostringstream& o, const EngineStats& s) {
  metric(o, "jtok_decode_steps_total", "batched decode steps", s.decode_steps);
  metric(o, "jtok_decode_sequences_total", "sequences over all decode steps (mean batch = this / steps)",
         s.decode_batch_sum);
  o << "# HELP jtok_decode_batch_size decode steps by batch size M\n# TYPE jtok_decode_batch_size histogram\n";
  const char* le[] = {"1", "3", "7", "15", "31", "+Inf"};
  int64_t cum = 0;
  for (int b = 0; b < 6; ++b) o << "jtok_decode_batch_size_bucket{le=\"" << le[b] << "\"} " << (cum += s.batch_hist[b]) << "\n";
  o << "jtok_decode_batch_size_sum " << s.decode_batch_sum << "\njtok_decode_batch_size_count " << s.decode_steps << "\n";
  metric(o, "jtok_table_rows_read_total", "token-table rows read by decode steps", s.table_rows_read);
  metric(o, "jtok_table_rows_prefetched_total", "token-table rows handed to the prefetch thread before use (mmap tables)",
         s.table_rows_prefetched);
  metric(o, "jtok_prefetch_pages_total", "pages of table rows touched by the prefetch thread", s.prefetch_pages);
  metric(o, "jtok_prefetch_major_faults_total", "major page faults taken by the prefetch thread (off the compute thread)",
         s.prefetch_major_faults);
  metric(o, "jtok_prefetch_jobs_dropped_total", "prefetch jobs dropped unstarted (the thread fell behind the steps)",
         s.prefetch_dropped);
}

// Prefix reuse: tokens reused, blocks stored, evicted, held.
void prefix_cache_metrics(std::ostringstream& o, const EngineStats& s) {
  metric(o, "jtok_prefix_tokens_reused_total", "prompt tokens taken from stored prefix blocks instead of prefilled",
         s.prefix_tokens_reused);
  metric(o, "jtok_prefix_hits_total", "prompts that reused at least one stored prefix block", s.prefix_hits);
  metric(o, "jtok_prefix_blocks_stored_total", "prefix blocks stored", s.prefix_blocks_stored);
  metric(o, "jtok_prefix_blocks_evicted_total", "prefix blocks evicted (least recently used first) to make room",
         s.prefix_blocks_evicted);
  metric(o, "jtok_prefix_blocks_cached", "prefix blocks stored now (each takes --prefix-block KV slots)",
         s.prefix_blocks_cached, "gauge");
  metric(o, "jtok_prefix_blocks_held", "stored prefix blocks held by running sequences (not evictable)",
         s.prefix_blocks_held, "gauge");
}

// The process: page faults and resident memory.
void process_metrics(std::ostringstream& o) {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  metric(o, "jtok_page_faults_major_total", "major page faults of the process (pages read from disk)", ru.ru_majflt);
  metric(o, "jtok_page_faults_minor_total", "minor page faults of the process", ru.ru_minflt);
  long pages = 0, resident = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  metric(o, "jtok_resident_bytes", "resident memory of the process", static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE),
         "gauge");
}

}  // namespace

struct HttpApi::Impl {
  Engine& engine;
  const Tokenizer& tok;
  ServeOptions opt;
  httplib::Server svr;
  EncodeThread encoder{tok};
  std::atomic<int64_t> next_id{1};
  std::atomic<int64_t> streams_open{0};
  std::atomic<bool> stop_asked{false};  // stop() was called: run()'s Stopper stops the server
  std::mutex metrics_mu;
  std::map<std::pair<std::string, int>, int64_t> responses;  // (route, status) -> count
  std::vector<double> latency_bounds{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  std::vector<int64_t> latency_counts = std::vector<int64_t>(10, 0);
  double latency_sum = 0;
  int64_t latency_n = 0;

  CompletionsRoute completions{engine,
                               tok,
                               opt.model_id,
                               std::min<int64_t>(opt.max_n, engine.options().max_batch),
                               // a text prompt as Hugging Face's tokenizer(text) and `jtok generate`
                               // encode it: Llama 3's <|begin_of_text|> first (a list of ids is taken as is)
                               [this](const std::string& s) { return encoder.encode(s, /*with_bos=*/true); },
                               [this](int status) { count("/v1/completions", status); },
                               [this](double s) { observe_latency(s); },
                               streams_open,
                               next_id,
                               /*chat=*/false,
                               {},
                               {},
                               {}};

  CompletionsRoute chat{engine,
                        tok,
                        opt.model_id,
                        std::min<int64_t>(opt.max_n, engine.options().max_batch),
                        [this](const std::string& s) { return encoder.encode(s); },
                        [this](int status) { count("/v1/chat/completions", status); },
                        [this](double s) { observe_latency(s); },
                        streams_open,
                        next_id,
                        /*chat=*/true,
                        {},  // render, no_template_reason, end_of_turn: set_up_chat
                        {},
                        {}};

  Impl(Engine& e, const Tokenizer& t, ServeOptions o) : engine(e), tok(t), opt(std::move(o)) { set_up_chat(); }

  // The chat route's template: loaded once; without one, chat requests get a 400 saying why.
  void set_up_chat() {
    try {
      if (opt.chat_template_dir.empty() && opt.chat_template.empty())
        fail("this model has no chat template (no tokenizer_config.json with one); start the server with "
             "--chat-template chatml|qwen3|llama3|llama3.1");
      ChatTemplate t = load_chat_template(opt.chat_template_dir, opt.chat_template);
      // Llama 3's templates write bos_token as text (it encodes to the BOS id), so the rendered
      // prompt is encoded without adding another; a named family without tokenizer_config.json
      // takes the tokenizer's own BOS.
      if (t.bos.empty() && tok.bos_id() >= 0) t.bos = tok.decode({tok.bos_id()});
      chat.render = [this, t](const nlohmann::json& messages, const ChatTemplateArgs& args) {
        return encoder.encode(render_chat(t, parse_chat_messages(messages), /*add_generation_prompt=*/true, args));
      };
      if (const int32_t id = tok.token_id(t.end_of_turn()); id >= 0) chat.end_of_turn = {id};
      std::printf("serve: chat template %s\n", chat_family_name(t.family));
    } catch (const Error& e) {
      chat.no_template_reason = e.what();
      std::printf("serve: no chat template (/v1/chat/completions answers 400): %s\n", e.what());
    }
  }

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
    for (const char* r : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"})
      if (path == r) return r;
    return "other";
  }

  static void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(dump_json(error_body(e)), "application/json");
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

  // The HTTP side: responses by route and status, the completion latency histogram.
  void http_metrics(std::ostringstream& o) {
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

  std::string metrics_text() {
    const EngineStats s = engine.stats();
    std::ostringstream o;
    http_metrics(o);
    request_metrics(o, s);
    decode_metrics(o, s);
    if (s.table_store) table_store_metrics(o, *s.table_store);
    prefix_cache_metrics(o, s);
    metric(o, "jtok_queue_depth", "requests waiting for admission", s.queue_depth, "gauge");
    metric(o, "jtok_active_sequences", "sequences in the decode batch", s.active, "gauge");
    metric(o, "jtok_kv_tokens_used", "KV-cache token slots reserved", s.kv_tokens_used, "gauge");
    metric(o, "jtok_kv_tokens_budget", "KV-cache token slots available", engine.options().kv_budget_tokens, "gauge");
    metric(o, "jtok_streams_open", "server-sent event streams open", streams_open.load(), "gauge");
    metric(o, "jtok_device_lost", "1 once the decoder's device is lost (restart the server)", s.device_lost ? 1 : 0,
           "gauge");
    process_metrics(o);
    o << "# HELP jtok_tables_info where the token tables live\n# TYPE jtok_tables_info gauge\njtok_tables_info{tables=\""
      << opt.tables << "\"} 1\n";
    return o.str();
  }

  void setup() {
    svr.new_task_queue = [n = opt.http_threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
    svr.set_payload_max_length(opt.max_body_bytes);
    svr.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) {
      if (authorized(q, r)) completions.handle(q, r);
      else count("/v1/completions", r.status);
    });
    svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) {
      if (authorized(q, r)) chat.handle(q, r);
      else count("/v1/chat/completions", r.status);
    });
    svr.Get("/v1/models", [this](const httplib::Request& q, httplib::Response& r) {
      if (authorized(q, r))
        r.set_content(dump_json({{"object", "list"},
                            {"data", json::array({{{"id", opt.model_id},
                                                   {"object", "model"},
                                                   {"created", 0},
                                                   {"owned_by", "jtok"}}})}}),
                      "application/json");
      count("/v1/models", r.status == -1 ? 200 : r.status);
    });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& r) {
      const std::string lost = engine.device_lost();
      if (lost.empty()) return r.set_content("{\"status\":\"ok\"}", "application/json");
      r.status = 503;  // a supervisor's cue to restart the server
      r.set_content(dump_json({{"status", "device_lost"}, {"error", lost}}), "application/json");
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

namespace {

// While run() serves: a thread that stops the server once stop() was called or, with watch_loss, once
// the engine's device is lost (the requests the loss cut have their answers first: svr.stop() lets
// the handlers under way finish). The HTTP library drops a stop that lands before the server listens,
// so it is repeated every 20 ms until the server has returned.
class Stopper {
 public:
  Stopper(const Engine& engine, httplib::Server& svr, const std::atomic<bool>& stop_asked, bool watch_loss)
      : thread_([this, &engine, &svr, &stop_asked, watch_loss] {
          while (!done_.load()) {
            if (stop_asked.load() || (watch_loss && !engine.device_lost().empty())) svr.stop();
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
        }) {}
  ~Stopper() {
    done_ = true;
    thread_.join();
  }
  Stopper(const Stopper&) = delete;
  Stopper& operator=(const Stopper&) = delete;

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;  // last: starts once done_ is made
};

}  // namespace

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
  bool listened = false;
  {
    Stopper stopper(impl_->engine, s, impl_->stop_asked, impl_->opt.exit_on_device_loss);
    listened = s.listen_after_bind();
  }
  const std::string lost = impl_->engine.device_lost();
  if (impl_->opt.exit_on_device_loss && !lost.empty())
    throw DeviceLost("the device was lost (" + lost +
                     "): the server stopped, for a supervisor to start it again (--keep-alive-on-device-loss "
                     "keeps it up, answering 503)");
  if (!listened) fail("the HTTP server on ", impl_->opt.host, ":", port, " stopped with an error");
}

void HttpApi::stop() {
  impl_->stop_asked = true;
  impl_->svr.stop();
}

}  // namespace jtok
