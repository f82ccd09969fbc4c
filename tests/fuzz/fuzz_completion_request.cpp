// The body of `jtok serve`'s POST /v1/completions (serve/completion_request.h), with the real GPT-2
// tokenizer encoding text prompts: every body gives either a request the engine can take (every
// field within its documented range: prompt, max_tokens (0 only with echo), sampling, stop,
// logprobs in [-1, 20], n in [1, max_n], best_of in [n, max_n], never best_of > n streamed) or a 4xx
// error with a message; anything else is a finding. The same body is also parsed as a chat
// completion (POST /v1/chat/completions: messages rendered with the qwen3 family's rules, the
// parsing and rendering of any messages value reached), which must give a request (max_tokens -1:
// the rest of the context, or >= 1; n in [1, max_n]; logprobs in [-1, 20]; no echo or best_of) or a 4xx.
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "fuzz_util.h"
#include "serve/chat_template.h"
#include "serve/completion_request.h"

static const jtok::Tokenizer* gpt2 = nullptr;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gpt2 = new jtok::Tokenizer(jtok::Tokenizer::load("gpt2"));  // seconds under ASan: once, before timing
  return 0;
}

static void check_chat(std::string_view body, const jtok::CompletionLimits& lim) {
  const jtok::ChatTemplate t{jtok::ChatFamily::qwen3, ""};
  const auto r = jtok::parse_chat_request(body, lim, [&](const nlohmann::json& m, const jtok::ChatTemplateArgs& a) {
    return gpt2->encode(jtok::render_chat(t, jtok::parse_chat_messages(m), true, a));
  });
  if (const auto* e = std::get_if<jtok::ApiError>(&r)) {
    if (e->status < 400 || e->status > 499 || e->message.empty()) std::abort();
    return;
  }
  const auto& q = std::get<jtok::CompletionRequest>(r);
  if (!q.chat || q.prompt.empty() || q.echo || q.logprobs < -1 || q.logprobs > 20 || q.best_of != q.n) std::abort();
  if (q.max_tokens == 0 || q.max_tokens < -1 || q.n < 1 || q.n > lim.max_n) std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const jtok::CompletionLimits lim{"jtok", static_cast<int64_t>(gpt2->vocab_size()), gpt2->eot_id(), 8};
  check_chat(body, lim);
  const auto r = jtok::parse_completion_request(body, lim, [](const std::string& s) { return gpt2->encode(s); });
  if (const auto* e = std::get_if<jtok::ApiError>(&r)) {
    if (e->status < 400 || e->status > 499 || e->message.empty() || e->type.empty()) std::abort();
    return 0;
  }
  const auto& q = std::get<jtok::CompletionRequest>(r);
  if (q.prompt.empty() || q.max_tokens < (q.echo ? 0 : 1) || q.stop.size() > 4) std::abort();
  if (q.logprobs < -1 || q.logprobs > jtok::kMaxTopLogprobs) std::abort();
  if (q.n < 1 || q.n > lim.max_n || q.best_of < q.n || q.best_of > lim.max_n) std::abort();
  if (q.stream && q.best_of > q.n) std::abort();
  for (int32_t id : q.prompt)
    if (id < 0 || id >= lim.vocab_size) std::abort();
  for (const auto& s : q.stop)
    if (s.empty()) std::abort();
  if (!(q.sampling.temperature >= 0 && q.sampling.temperature <= 2)) std::abort();
  if (!(q.sampling.top_p > 0 && q.sampling.top_p <= 1) || q.sampling.top_k < 0) std::abort();
  return 0;
}
