// BLiMP (../shared/data/blimp): 67 paradigms of 1,000 minimal pairs. The "simple LM method": a
// pair is right when the whole good sentence has a higher total log-probability than the bad one.
// Sentences are scored as [<|endoftext|>] + tokens, summing log p of every sentence token.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace jtok {

struct BlimpPair {
  std::string good, bad, field, term, uid;
};

// Reads every paradigm file of dir (not models_summary.jsonl); at most `limit` pairs each (0 = all).
std::vector<BlimpPair> load_blimp(const std::string& dir, int64_t limit);

// score(sentences) -> total log-probability of each. Returns accuracy overall, per field, per
// linguistics term and per paradigm, with the BLiMP authors' model figures beside them
// (from models_summary.jsonl, averaged the same way) when present.
nlohmann::json evaluate_blimp(const std::vector<BlimpPair>& pairs,
                              const std::function<std::vector<double>(const std::vector<std::string>&)>& score,
                              const std::string& dir);

}  // namespace jtok
