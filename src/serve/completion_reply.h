// The pieces of a /v1/completions reply beyond the text: the legacy `logprobs` object of a choice
// and the choice of the best n of best_of.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "infer/logprobs.h"

namespace jtok {

// The OpenAI legacy completions `logprobs` object, built token by token:
//   tokens          each token's text (its bytes decoded alone; invalid UTF-8 as U+FFFD)
//   token_logprobs  log p(token | prefix); null for the first prompt token (nothing before it)
//   top_logprobs    {text: log-prob} of the top N tokens and the chosen one (so up to N + 1
//                   entries, fewer where texts coincide); null where token_logprobs is
//   text_offset     byte offset of the token's text in the choice's text (echoed prompt included)
// take() returns the tokens added since the previous take (a streamed event's share); offsets go on.
// With chat, OpenAI's chat format instead: {content: [{token, logprob, bytes, top_logprobs: [{token,
// logprob, bytes}] (the top N, most likely first)}], refusal: null}, bytes the token's own bytes
// (its text may be a part of a UTF-8 character, shown as U+FFFD).
class LogprobsBuilder {
 public:
  explicit LogprobsBuilder(const Tokenizer& tok, bool chat = false) : tok_(tok), chat_(chat) { clear(); }
  void add_unscored(int32_t id);   // a token without a log-prob (the prompt's first; not with chat)
  void add(const TokenLogprob& lp);
  size_t offset() const { return offset_; }  // text bytes of the tokens added so far
  bool empty() const { return chat_ ? content_.empty() : tokens_.empty(); }
  nlohmann::json take();

 private:
  void clear();
  size_t push_text(int32_t id);
  nlohmann::json chat_entry(int32_t id, float logprob) const;
  const Tokenizer& tok_;
  bool chat_;
  size_t offset_ = 0;
  nlohmann::json tokens_, token_logprobs_, top_logprobs_, text_offset_, content_;
};

// Indices of the n best of totals (highest first; ties to the lower index): best_of's choice.
std::vector<size_t> best_choices(const std::vector<double>& totals, size_t n);

}  // namespace jtok
