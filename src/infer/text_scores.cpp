#include "infer/text_scores.h"

#include <algorithm>
#include <map>

namespace jtok {

std::vector<std::vector<int32_t>> scored_text_ids(const Tokenizer& tok, const std::vector<std::string>& texts,
                                                  int64_t max_positions) {
  std::vector<std::vector<int32_t>> ids(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    ids[i].push_back(tok.bos_id() >= 0 ? tok.bos_id() : tok.eot_id());
    tok.encode(texts[i], ids[i]);
    if (static_cast<int64_t>(ids[i].size()) > max_positions) ids[i].resize(static_cast<size_t>(max_positions));
  }
  return ids;
}

std::vector<std::vector<float>> sequence_token_logprobs(const Model& m, const std::vector<std::vector<int32_t>>& ids,
                                                        int64_t batch) {
  std::map<size_t, std::vector<size_t>> by_len;
  for (size_t i = 0; i < ids.size(); ++i) by_len[ids[i].size()].push_back(i);
  std::vector<std::vector<float>> out(ids.size());
  Activations acts;
  for (auto& [len, members] : by_len) {
    if (len < 2) continue;  // nothing to score
    const int64_t T = static_cast<int64_t>(len) - 1;
    for (size_t s = 0; s < members.size(); s += static_cast<size_t>(batch)) {
      const int64_t B = std::min<int64_t>(batch, static_cast<int64_t>(members.size() - s));
      std::vector<int32_t> x(B * T), y(B * T);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
          x[b * T + t] = ids[members[s + b]][t];
          y[b * T + t] = ids[members[s + b]][t + 1];
        }
      forward(m, acts, x.data(), B, T);
      std::vector<float> lp(B * T);
      token_logprobs(m, acts, y.data(), lp.data());
      for (int64_t b = 0; b < B; ++b) out[members[s + b]].assign(lp.begin() + b * T, lp.begin() + (b + 1) * T);
    }
  }
  return out;
}

std::vector<double> score_texts(const Model& m, const Tokenizer& tok, const std::vector<std::string>& texts,
                                int64_t batch) {
  const auto lps = sequence_token_logprobs(m, scored_text_ids(tok, texts, m.cfg.max_position_embeddings), batch);
  std::vector<double> out(texts.size(), 0.0);
  for (size_t i = 0; i < lps.size(); ++i)
    for (float v : lps[i]) out[i] += v;
  return out;
}

}  // namespace jtok
