// POST /v1/completions: parse (completion_request.h), submit the request's choices to the engine,
// answer with the whole reply or a stream of server-sent events, with the text, the legacy
// `logprobs` object when asked (completion_reply.h), the echoed prompt, and n of best_of choices.
// With `chat`, POST /v1/chat/completions: the messages rendered by the model's chat template
// (chat_template.h), the replies in the chat format (choices[].message, or .delta when streamed).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "serve/completion_request.h"
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
  bool chat = false;
  ChatRenderer render;                // chat: messages -> prompt ids; empty: the model has no template
  std::string no_template_reason;     // chat without render: why (the 400's message)
  std::vector<int32_t> end_of_turn;   // chat: generation stops at these ids too

  // Authorization is the caller's. Outlives every stream it starts (the server stops first).
  void handle(const httplib::Request& req, httplib::Response& res);
};

}  // namespace jtok
