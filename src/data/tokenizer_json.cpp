// tokenizer.json with model.vocab and model.merges streamed out of nlohmann's callback parser.
// The callback's depth is the number of open containers: 1 for the root's keys, 2 for model's, 3
// for vocab's entries and merges' items (1 for a root that is the vocabulary).
#include "data/tokenizer_json.h"

namespace jtok {

namespace {
using json = nlohmann::json;
using Event = json::parse_event_t;

class Collector {
 public:
  // root_vocab: the root object is the vocabulary (GPT-2's encoder.json), not model.vocab.
  Collector(TokenizerJson& out, bool keep, bool root_vocab) : out_(out), keep_(keep), root_vocab_(root_vocab) {}

  // true keeps the value in the tree (json::parser_callback_t).
  bool operator()(int depth, Event event, json& parsed) {
    if (root_vocab_) return depth == 1 ? vocab_event(event, parsed) : true;
    if (event == Event::key && depth <= 2) {
      key_[depth] = parsed.get<std::string>();
      if (depth == 1) key_[2].clear();  // a new root field: no model field is open
      return true;
    }
    if (depth == 2 && key_[1] == "model" && key_[2] == "merges" &&
        (event == Event::array_start || event == Event::object_start))
      merges_array_ = event == Event::array_start;
    if (depth != 3 || key_[1] != "model") return true;
    if (key_[2] == "vocab") return vocab_event(event, parsed);
    if (key_[2] == "merges" && merges_array_) return merge_event(event, parsed);
    return true;
  }

 private:
  // model.vocab: a token (never stored in the tree), then its id: a scalar, or a container (its
  // id recorded as an empty one of that kind, which the loader's id check names).
  bool vocab_event(Event event, json& parsed) {
    switch (event) {
      case Event::key:
        token_ = parsed.get<std::string>();
        has_token_ = true;
        return false;
      case Event::value:
        take(parsed);
        return true;  // the key was not kept, so the parser drops the value and its key's slot
      case Event::object_start:
      case Event::array_start: {
        json empty = event == Event::object_start ? json::object() : json::array();
        take(empty);
        return true;
      }
      default:
        return true;
    }
  }

  void take(json& id) {
    if (!has_token_) return;  // an item of a vocab that is an array: the loader refuses the array
    has_token_ = false;
    if (keep_) out_.vocab.emplace_back(std::move(token_), std::move(id));
  }

  // model.merges (an array): each item taken whole, a string at its value or a pair at its end.
  bool merge_event(Event event, json& parsed) {
    if (event == Event::value || event == Event::array_end || event == Event::object_end) {
      if (keep_) out_.merges.push_back(std::move(parsed));
      return false;
    }
    return true;
  }

  TokenizerJson& out_;
  bool keep_, root_vocab_;
  std::string key_[3];
  std::string token_;
  bool has_token_ = false;
  bool merges_array_ = false;
};

TokenizerJson parse_collecting(const std::string& text, bool keep_vocab, bool root_vocab) {
  TokenizerJson out;
  Collector collect(out, keep_vocab, root_vocab);
  out.rest =
      json::parse(text, [&collect](int depth, Event event, json& parsed) { return collect(depth, event, parsed); });
  return out;
}
}  // namespace

TokenizerJson parse_tokenizer_json(const std::string& text, bool keep_vocab) {
  return parse_collecting(text, keep_vocab, /*root_vocab=*/false);
}

TokenizerJson parse_token_ids_json(const std::string& text) {
  return parse_collecting(text, true, /*root_vocab=*/true);
}

}  // namespace jtok
