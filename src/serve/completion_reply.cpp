#include "serve/completion_reply.h"

#include <algorithm>
#include <numeric>

#include "serve/api_json.h"

namespace jtok {

using json = nlohmann::json;

void LogprobsBuilder::clear() {
  tokens_ = json::array();
  token_logprobs_ = json::array();
  top_logprobs_ = json::array();
  text_offset_ = json::array();
  content_ = json::array();
}

json LogprobsBuilder::chat_entry(int32_t id, float logprob) const {
  const std::string text = tok_.decode({id});
  json bytes = json::array();
  for (unsigned char ch : text) bytes.push_back(static_cast<int>(ch));
  return {{"token", valid_utf8(text)}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
}

size_t LogprobsBuilder::push_text(int32_t id) {
  const std::string text = tok_.decode({id});
  tokens_.push_back(valid_utf8(text));
  text_offset_.push_back(offset_);
  offset_ += text.size();
  return text.size();
}

void LogprobsBuilder::add_unscored(int32_t id) {
  push_text(id);
  token_logprobs_.push_back(nullptr);
  top_logprobs_.push_back(nullptr);
}

void LogprobsBuilder::add(const TokenLogprob& lp) {
  if (chat_) {
    offset_ += tok_.decode({lp.token}).size();
    json e = chat_entry(lp.token, lp.logprob), top = json::array();
    for (const auto& [id, v] : lp.top) top.push_back(chat_entry(id, v));
    e["top_logprobs"] = std::move(top);
    content_.push_back(std::move(e));
    return;
  }
  push_text(lp.token);
  token_logprobs_.push_back(lp.logprob);
  json top = json::object();
  for (const auto& [id, v] : lp.top) top.emplace(valid_utf8(tok_.decode({id})), v);  // the likelier of equal texts
  top.emplace(valid_utf8(tok_.decode({lp.token})), lp.logprob);  // the chosen token, if not among them
  top_logprobs_.push_back(std::move(top));
}

json LogprobsBuilder::take() {
  if (chat_) {
    json out = {{"content", std::move(content_)}, {"refusal", nullptr}};
    clear();
    return out;
  }
  json out = {{"tokens", std::move(tokens_)},
              {"token_logprobs", std::move(token_logprobs_)},
              {"top_logprobs", std::move(top_logprobs_)},
              {"text_offset", std::move(text_offset_)}};
  clear();
  return out;
}

std::vector<size_t> best_choices(const std::vector<double>& totals, size_t n) {
  std::vector<size_t> idx(totals.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return totals[a] > totals[b]; });
  idx.resize(std::min(n, idx.size()));
  return idx;
}

}  // namespace jtok
