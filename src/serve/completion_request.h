// The body of POST /v1/completions, parsed and checked apart from the server, so that any byte
// string can be tried on it (tests/fuzz/fuzz_completion_request.cpp): every body gives either a
// request the engine can take or the 4xx answer naming the bad field; nothing else escapes.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "infer/generate.h"
#include "infer/logprobs.h"
#include "serve/chat_template.h"

namespace jtok {

// A client error: HTTP status, OpenAI error type and code, and the message.
struct ApiError {
  int status;
  std::string message, type = "invalid_request_error", param, code;
};

// What a completion request asks for, checked.
struct CompletionRequest {
  std::vector<int32_t> prompt;   // 1 <= size, every id in [0, vocab_size)
  int64_t max_tokens = 16;       // >= 1; 0 allowed with echo (the prompt scored, nothing generated)
  SamplingParams sampling{1.0, 0, 1.0};
  uint64_t seed = 0;             // the request's, or one from the clock
  bool stream = false, include_usage = false, ignore_eos = false;
  std::vector<std::string> stop; // at most 4, none empty
  int logprobs = -1;             // -1: none; 0..20: each token's log-prob and the top that many (chat:
                                 // logprobs true with top_logprobs, default 0)
  bool echo = false;             // the prompt's tokens come back first, in text and logprobs
  int64_t n = 1;                 // choices returned, 1..max_n
  int64_t best_of = 1;           // choices generated, n..max_n; the n of highest total log-prob are returned
                                 // (best_of > n is refused with stream)
  bool chat = false;             // a chat completion: the prompt is the rendered messages; max_tokens -1:
                                 // the rest of the context
};

struct CompletionLimits {
  std::string model_id;  // a request naming another model gets 404
  int64_t vocab_size = 0;
  int32_t eot_id = 0;    // the prompt of an empty text
  int64_t max_n = 8;      // n and best_of at most
};

using PromptEncoder = std::function<std::vector<int32_t>(const std::string&)>;

// The request, or the error to answer (status 400, or 404 for an unknown model). Throws only what
// encode throws.
std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body, const CompletionLimits& lim,
                                                                   const PromptEncoder& encode);

// The body of POST /v1/chat/completions: render turns its messages into the prompt's ids with the
// model's chat template and the request's chat_template_kwargs (vLLM's and SGLang's field: a
// non-object is a 400 on it; variables no template reads are ignored); a jtok::Error render throws,
// naming the message and field, becomes a 400 on `messages`. Shares sampling, seed, stop and
// streaming with completions.
using ChatRenderer = std::function<std::vector<int32_t>(const nlohmann::json& messages, const ChatTemplateArgs& args)>;
std::variant<CompletionRequest, ApiError> parse_chat_request(std::string_view body, const CompletionLimits& lim,
                                                             const ChatRenderer& render);

}  // namespace jtok
