#include "serve/completion_request.h"

#include <atomic>
#include <chrono>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_int.h"

namespace jtok {

namespace {

using json = nlohmann::json;

std::string type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "a number";
  }
}

[[noreturn]] void bad(const std::string& param, const std::string& msg, int status = 400, const std::string& code = "") {
  throw ApiError{status, msg, "invalid_request_error", param, code};
}

// An integer field; a float with an integral value within +-2^53 is taken too (JSON clients may
// send 16.0).
int64_t get_int(const json& body, const char* name, int64_t dflt) {
  if (!body.contains(name) || body[name].is_null()) return dflt;
  const json& v = body[name];
  if (const auto x = json_int64(v, /*integral_floats=*/true)) return *x;
  if (v.is_number_unsigned()) bad(name, std::string(name) + " " + v.dump() + " is too large");
  bad(name, std::string(name) + " must be an integer, got " + type_name(v) + " (" + v.dump() + ")");
}

double get_number(const json& body, const char* name, double dflt) {
  if (!body.contains(name) || body[name].is_null()) return dflt;
  const json& v = body[name];
  if (!v.is_number()) bad(name, std::string(name) + " must be a number, got " + type_name(v));
  return v.get<double>();
}

bool get_bool(const json& obj, const char* name, bool dflt) {
  if (!obj.contains(name) || obj[name].is_null()) return dflt;
  if (!obj[name].is_boolean()) bad(name, std::string(name) + " must be a boolean, got " + type_name(obj[name]));
  return obj[name].get<bool>();
}

// max_tokens, echo, logprobs, n, best_of: how many tokens, how many choices, which log-probs.
void parse_choices(CompletionRequest& p, const json& body, const CompletionLimits& lim) {
  p.echo = get_bool(body, "echo", false);
  p.max_tokens = get_int(body, "max_tokens", 16);
  if (p.max_tokens < 0) bad("max_tokens", "max_tokens must be at least 1 (0 with echo), got " + std::to_string(p.max_tokens));
  if (p.max_tokens == 0 && !p.echo)
    bad("max_tokens", "max_tokens 0 is allowed only with echo: true (the prompt's log-probs, nothing generated)");
  const int64_t lp = get_int(body, "logprobs", -1);
  if (body.contains("logprobs") && !body["logprobs"].is_null() && (lp < 0 || lp > kMaxTopLogprobs))
    bad("logprobs", "logprobs must be an integer in [0, " + std::to_string(kMaxTopLogprobs) + "], got " +
                        body["logprobs"].dump());
  p.logprobs = static_cast<int>(lp);
  p.n = get_int(body, "n", 1);
  if (p.n < 1 || p.n > lim.max_n)
    bad("n", "n must be in [1, " + std::to_string(lim.max_n) + "] (this server's --max-n), got " + std::to_string(p.n));
  p.best_of = get_int(body, "best_of", p.n);
  if (p.best_of < p.n || p.best_of > lim.max_n)
    bad("best_of", "best_of must be in [n, " + std::to_string(lim.max_n) + "] (n = " + std::to_string(p.n) +
                       ", --max-n), got " + std::to_string(p.best_of));
}

void check_model(const json& body, const CompletionLimits& lim) {
  if (!body.is_object()) bad("", "the request body must be a JSON object, got " + type_name(body));
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) bad("model", "model must be a string, got " + type_name(body["model"]));
    if (body["model"].get<std::string>() != lim.model_id)
      bad("model", "the model '" + body["model"].get<std::string>() + "' does not exist; this server serves '" +
                       lim.model_id + "'",
          404, "model_not_found");
  }
}

std::vector<int32_t> parse_prompt(const json& body, const CompletionLimits& lim, const PromptEncoder& encode) {
  if (!body.contains("prompt")) bad("prompt", "prompt is required (text, or a list of token ids)");
  json prompt = body["prompt"];
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) prompt = prompt[0];
  std::vector<int32_t> ids;
  if (prompt.is_string()) {
    ids = encode(prompt.get<std::string>());
    if (ids.empty()) ids.push_back(lim.eot_id);  // unconditional, as `jtok generate` does
    return ids;
  }
  if (!prompt.is_array()) bad("prompt", "prompt must be a string or a list of token ids, got " + type_name(prompt));
  if (prompt.empty()) bad("prompt", "prompt is an empty list");
  for (const auto& v : prompt) {
    if (v.is_string() || v.is_array()) bad("prompt", "one prompt per request: give a string or one list of token ids");
    if (!v.is_number_integer()) bad("prompt", "prompt token ids must be integers, got " + type_name(v));
    const int64_t id = json_int64(v).value_or(INT64_MAX);  // past int64: outside the vocabulary too
    if (id < 0 || id >= lim.vocab_size)
      bad("prompt", "prompt token id " + v.dump() + " is outside the vocabulary [0, " + std::to_string(lim.vocab_size) + ")");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

std::vector<std::string> parse_stop(const json& body) {
  std::vector<std::string> stop;
  if (!body.contains("stop") || body["stop"].is_null()) return stop;
  const json& s = body["stop"];
  if (s.is_string()) {
    stop.push_back(s.get<std::string>());
  } else if (s.is_array()) {
    if (s.size() > 4) bad("stop", "stop takes at most 4 sequences");
    for (const auto& e : s) {
      if (!e.is_string()) bad("stop", "stop sequences must be strings, got " + type_name(e));
      stop.push_back(e.get<std::string>());
    }
  } else {
    bad("stop", "stop must be a string or a list of strings, got " + type_name(s));
  }
  for (const auto& s2 : stop)
    if (s2.empty()) bad("stop", "stop sequences must not be empty");
  return stop;
}

// The fields completions and chat completions share: sampling, seed, streaming, stop.
void parse_sampling(CompletionRequest& p, const json& body) {
  p.sampling.temperature = get_number(body, "temperature", 1.0);
  if (p.sampling.temperature < 0 || p.sampling.temperature > 2)
    bad("temperature", "temperature must be in [0, 2], got " + std::to_string(p.sampling.temperature));
  p.sampling.top_p = get_number(body, "top_p", 1.0);
  if (!(p.sampling.top_p > 0 && p.sampling.top_p <= 1))
    bad("top_p", "top_p must be in (0, 1], got " + std::to_string(p.sampling.top_p));
  p.sampling.top_k = get_int(body, "top_k", 0);
  if (p.sampling.top_k == -1) p.sampling.top_k = 0;  // vLLM's "off"
  if (p.sampling.top_k < 0) bad("top_k", "top_k must be >= 0 (0 or -1: off), got " + std::to_string(p.sampling.top_k));
  if (body.contains("seed") && !body["seed"].is_null()) {
    p.seed = static_cast<uint64_t>(get_int(body, "seed", 0));
  } else {
    static std::atomic<uint64_t> counter{0};
    p.seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) + 7919 * counter++;
  }
  p.stream = get_bool(body, "stream", false);
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json& so = body["stream_options"];
    if (!so.is_object()) bad("stream_options", "stream_options must be an object, got " + type_name(so));
    p.include_usage = get_bool(so, "include_usage", false);
  }
  p.stop = parse_stop(body);
  p.ignore_eos = get_bool(body, "ignore_eos", false);  // vLLM's extension
}

CompletionRequest parse(const json& body, const CompletionLimits& lim, const PromptEncoder& encode) {
  check_model(body, lim);
  CompletionRequest p;
  p.prompt = parse_prompt(body, lim, encode);
  parse_choices(p, body, lim);
  parse_sampling(p, body);
  if (p.best_of > p.n && p.stream)
    bad("best_of", "best_of > n cannot be streamed: the best choices are known only when all have finished");
  return p;
}

// Chat completions: messages rendered by the model's chat template into the prompt; max_tokens (or
// max_completion_tokens) defaults to the rest of the context (-1 here); n choices; logprobs (a
// boolean) with top_logprobs 0..20; no echo or best_of.
CompletionRequest parse_chat(const json& body, const CompletionLimits& lim, const ChatRenderer& render) {
  check_model(body, lim);
  CompletionRequest p;
  p.chat = true;
  if (!body.contains("messages")) bad("messages", "messages is required (a list of {role, content})");
  ChatTemplateArgs args;
  try {
    args = parse_chat_template_args(body.value("chat_template_kwargs", json()), "chat_template_kwargs");
  } catch (const Error& e) {
    bad("chat_template_kwargs", e.what());
  }
  try {
    p.prompt = render(body["messages"], args);
  } catch (const Error& e) {
    bad("messages", e.what());
  }
  for (const char* f : {"echo", "best_of", "suffix"})
    if (body.contains(f) && !body[f].is_null()) bad(f, std::string(f) + " is not a field of chat completions");
  const bool lp = get_bool(body, "logprobs", false);
  const int64_t top = get_int(body, "top_logprobs", 0);
  const bool top_given = body.contains("top_logprobs") && !body["top_logprobs"].is_null();
  if (top_given && (top < 0 || top > kMaxTopLogprobs))
    bad("top_logprobs", "top_logprobs must be an integer in [0, " + std::to_string(kMaxTopLogprobs) + "], got " +
                            body["top_logprobs"].dump());
  if (top_given && !lp) bad("top_logprobs", "top_logprobs needs logprobs: true");
  p.logprobs = lp ? static_cast<int>(top) : -1;
  const char* mt = body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null()
                       ? "max_completion_tokens" : "max_tokens";
  p.max_tokens = get_int(body, mt, -1);
  if (body.contains(mt) && !body[mt].is_null() && p.max_tokens < 1)
    bad(mt, std::string(mt) + " must be at least 1, got " + std::to_string(p.max_tokens));
  p.n = get_int(body, "n", 1);
  if (p.n < 1 || p.n > lim.max_n)
    bad("n", "n must be in [1, " + std::to_string(lim.max_n) + "] (this server's --max-n), got " + std::to_string(p.n));
  p.best_of = p.n;
  parse_sampling(p, body);
  return p;
}

}  // namespace

namespace {
json parse_body(std::string_view body) {
  try {
    return json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e+3080
    bad("", std::string("the request body is not valid JSON: ") + e.what());
  }
}
}  // namespace

std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body, const CompletionLimits& lim,
                                                                   const PromptEncoder& encode) {
  try {
    return parse(parse_body(body), lim, encode);
  } catch (const ApiError& e) {
    return e;
  }
}

std::variant<CompletionRequest, ApiError> parse_chat_request(std::string_view body, const CompletionLimits& lim,
                                                             const ChatRenderer& render) {
  try {
    return parse_chat(parse_body(body), lim, render);
  } catch (const ApiError& e) {
    return e;
  }
}

}  // namespace jtok
