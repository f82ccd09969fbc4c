// POST /v1/completions: parse (completion_request.h), submit the request's choices to the engine,
// answer with the whole reply or a stream of server-sent events, with the text, the legacy
// `logprobs` object when asked (completion_reply.h), the echoed prompt, and n of best_of choices.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "serve/engine.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace jtok {

struct CompletionsRoute {
  Engine& engine;
  const Tokenizer& tok;
  std::string model_id;
  int64_t max_n = 8;                                            // n and best_of at most
  std::function<std::vector<int32_t>(const std::string&)> encode;
  std::function<void(int status)> count;                        // one response of this route
  std::function<void(double seconds)> observe_latency;          // one request served whole
  std::atomic<int64_t>& streams_open;
  std::atomic<int64_t>& next_id;

  // Authorization is the caller's. Outlives every stream it starts (the server stops first).
  void handle(const httplib::Request& req, httplib::Response& res);
};

}  // namespace jtok
