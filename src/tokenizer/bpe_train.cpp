#include "tokenizer/bpe_train.h"

#include <algorithm>
#include <filesystem>
#include <queue>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "data/bpe.h"
#include "data/pretokenize.h"
#include "data/unicode.h"

namespace jtok {

namespace {

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
int32_t key_left(uint64_t k) { return int32_t(k >> 32); }
int32_t key_right(uint64_t k) { return int32_t(k & 0xffffffffu); }

// GPT-2's id order of the 256 bytes: the printable bytes (mapped to themselves) in increasing
// order, then the others (mapped to 256 + n), i.e. the bytes sorted by their unicode form.
std::vector<uint8_t> gpt2_byte_order() {
  std::vector<uint8_t> order(256);
  for (int b = 0; b < 256; ++b) order[b] = uint8_t(b);
  std::sort(order.begin(), order.end(), [](uint8_t x, uint8_t y) { return byte_to_unicode(x) < byte_to_unicode(y); });
  return order;
}

// The state both trainers share: vocabulary, its index, the words as symbol ids.
struct Words {
  std::vector<std::vector<int32_t>> syms;
  std::vector<int64_t> count;
  BpeModel model;
  std::unordered_map<std::string, int32_t> id_of;

  Words(const std::unordered_map<std::string, int64_t>& word_counts, int64_t vocab_size) {
    if (vocab_size < 257) fail("tokenizer train: --vocab-size ", vocab_size, " is below 257 (256 bytes + <|endoftext|>)");
    if (vocab_size > (int64_t(1) << 30)) fail("tokenizer train: --vocab-size ", vocab_size, " is too large");
    std::vector<uint8_t> order = gpt2_byte_order();
    int32_t byte_id[256];
    for (int i = 0; i < 256; ++i) {
      byte_id[order[i]] = i;
      model.vocab.push_back(std::string(1, char(order[i])));
      id_of.emplace(model.vocab.back(), i);
    }
    std::vector<const std::pair<const std::string, int64_t>*> sorted;
    sorted.reserve(word_counts.size());
    for (const auto& wc : word_counts)
      if (wc.second > 0 && !wc.first.empty()) sorted.push_back(&wc);
    std::sort(sorted.begin(), sorted.end(), [](auto* x, auto* y) { return x->first < y->first; });
    for (auto* wc : sorted) {
      std::vector<int32_t> s(wc->first.size());
      for (size_t i = 0; i < s.size(); ++i) s[i] = byte_id[uint8_t(wc->first[i])];
      syms.push_back(std::move(s));
      count.push_back(wc->second);
    }
  }

  // Records the merge of (a, b): returns the id of the merged token (an existing id when its bytes
  // are already a token, made by other merges). add_merge says whether it is a new merge line.
  int32_t merge_id(int32_t a, int32_t b, bool add_merge) {
    std::string bytes = model.vocab[a] + model.vocab[b];
    auto it = id_of.find(bytes);
    int32_t id;
    if (it != id_of.end()) {
      id = it->second;
    } else {
      id = int32_t(model.vocab.size());
      model.vocab.push_back(bytes);
      id_of.emplace(std::move(bytes), id);
    }
    if (add_merge) model.merges.emplace_back(a, b);
    return id;
  }

  void finish() {
    model.eot_id = int32_t(model.vocab.size());
    model.vocab.emplace_back();
  }
};

// Merges every (a, b) in s, left to right, into m.
bool merge_word(const std::vector<int32_t>& s, int32_t a, int32_t b, int32_t m, std::vector<int32_t>& out) {
  out.clear();
  bool any = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
      out.push_back(m);
      ++i;
      any = true;
    } else {
      out.push_back(s[i]);
    }
  }
  return any;
}

struct HeapEntry {
  int64_t count;
  uint64_t key;
  // priority_queue pops the largest: higher count first, then the smaller key.
  bool operator<(const HeapEntry& o) const { return count != o.count ? count < o.count : key > o.key; }
};

using PairCounts = std::unordered_map<uint64_t, int64_t>;           // pair -> weighted count
using PairWords = std::unordered_map<uint64_t, std::vector<uint32_t>>;  // pair -> words that (may) hold it

// Every adjacent pair of every word, counted and indexed.
void count_pairs(const Words& w, PairCounts& pc, PairWords& where) {
  for (uint32_t i = 0; i < w.syms.size(); ++i) {
    const auto& s = w.syms[i];
    for (size_t j = 0; j + 1 < s.size(); ++j) {
      uint64_t k = pair_key(s[j], s[j + 1]);
      pc[k] += w.count[i];
      auto& v = where[k];
      if (v.empty() || v.back() != i) v.push_back(i);
    }
  }
}

// Merges (a, b) into m in the words ws (sorted, unique): their pairs' counts and index updated,
// every pair whose count changed appended to changed; ns is scratch.
void merge_in_words(Words& w, const std::vector<uint32_t>& ws, int32_t a, int32_t b, int32_t m, PairCounts& pc,
                    PairWords& where, std::vector<int32_t>& ns, std::vector<uint64_t>& changed) {
  for (uint32_t i : ws) {
    auto& s = w.syms[i];
    if (!merge_word(s, a, b, m, ns)) continue;
    const int64_t c = w.count[i];
    for (size_t j = 0; j + 1 < s.size(); ++j) {
      uint64_t k = pair_key(s[j], s[j + 1]);
      pc[k] -= c;
      changed.push_back(k);
    }
    for (size_t j = 0; j + 1 < ns.size(); ++j) {
      uint64_t k = pair_key(ns[j], ns[j + 1]);
      pc[k] += c;
      changed.push_back(k);
      if (ns[j] == m || ns[j + 1] == m) {
        auto& v = where[k];
        if (v.empty() || v.back() != i) v.push_back(i);
      }
    }
    s.swap(ns);
  }
}

// The changed pairs (each once) back on the heap at their new counts; pairs gone to 0 dropped.
void requeue(std::vector<uint64_t>& changed, PairCounts& pc, std::priority_queue<HeapEntry>& heap) {
  std::sort(changed.begin(), changed.end());
  changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
  for (uint64_t k : changed) {
    auto p = pc.find(k);
    if (p->second > 0) heap.push({p->second, k});
    else pc.erase(p);
  }
}

}  // namespace

void PieceCounter::add_text(std::string_view text) {
  std::string clean;
  if (!unicode::is_valid_utf8(text)) {
    clean = unicode::sanitize_utf8(text);
    text = clean;
  }
  CodePoints cps;
  to_code_points(text, cps);
  std::vector<uint32_t> ends;
  gpt2_pretokenize(cps, ends);
  uint32_t start = 0;
  for (uint32_t e : ends) {
    ++counts_[std::string(text.substr(start, e - start))];
    start = e;
  }
  pieces_ += int64_t(ends.size());
  bytes_ += int64_t(text.size());
}

BpeModel train_bpe(const std::unordered_map<std::string, int64_t>& word_counts, int64_t vocab_size) {
  Words w(word_counts, vocab_size);
  PairCounts pc;
  PairWords where;
  count_pairs(w, pc, where);
  std::priority_queue<HeapEntry> heap;
  {
    std::vector<HeapEntry> init;
    init.reserve(pc.size());
    for (const auto& [k, c] : pc) init.push_back({c, k});
    heap = std::priority_queue<HeapEntry>(std::less<HeapEntry>(), std::move(init));
  }
  std::unordered_map<uint64_t, char> done;  // pairs merged before
  std::vector<int32_t> ns;
  std::vector<uint64_t> changed;
  while (int64_t(w.model.vocab.size()) < vocab_size - 1 && !heap.empty()) {
    HeapEntry top = heap.top();
    heap.pop();
    auto it = pc.find(top.key);
    if (it == pc.end() || it->second != top.count || top.count <= 0) continue;  // stale
    const int32_t a = key_left(top.key), b = key_right(top.key);
    const bool again = done.count(top.key) != 0;
    done[top.key] = 1;
    const int32_t m = w.merge_id(a, b, !again);
    std::vector<uint32_t> ws = std::move(where[top.key]);
    where.erase(top.key);
    std::sort(ws.begin(), ws.end());
    ws.erase(std::unique(ws.begin(), ws.end()), ws.end());
    changed.clear();
    merge_in_words(w, ws, a, b, m, pc, where, ns, changed);
    requeue(changed, pc, heap);
  }
  w.finish();
  return std::move(w.model);
}

BpeModel train_bpe_reference(const std::unordered_map<std::string, int64_t>& word_counts, int64_t vocab_size) {
  Words w(word_counts, vocab_size);
  std::unordered_map<uint64_t, char> done;
  std::vector<int32_t> ns;
  while (int64_t(w.model.vocab.size()) < vocab_size - 1) {
    std::unordered_map<uint64_t, int64_t> pc;
    for (size_t i = 0; i < w.syms.size(); ++i)
      for (size_t j = 0; j + 1 < w.syms[i].size(); ++j) pc[pair_key(w.syms[i][j], w.syms[i][j + 1])] += w.count[i];
    bool found = false;
    HeapEntry best{0, 0};
    for (const auto& [k, c] : pc) {
      HeapEntry e{c, k};
      if (c > 0 && (!found || best < e)) { best = e; found = true; }
    }
    if (!found) break;
    const int32_t a = key_left(best.key), b = key_right(best.key);
    const bool again = done.count(best.key) != 0;
    done[best.key] = 1;
    const int32_t m = w.merge_id(a, b, !again);
    for (auto& s : w.syms)
      if (merge_word(s, a, b, m, ns)) s.swap(ns);
  }
  w.finish();
  return std::move(w.model);
}

namespace {
std::string unicode_form(const std::string& bytes) {
  std::string s;
  for (unsigned char c : bytes) unicode::append_utf8(s, byte_to_unicode(c));
  return s;
}
}  // namespace

std::string encoder_json(const BpeModel& m) {
  std::string out = "{";
  for (size_t id = 0; id < m.vocab.size(); ++id) {
    const std::string tok = int32_t(id) == m.eot_id ? std::string("<|endoftext|>") : unicode_form(m.vocab[id]);
    if (id) out += ", ";
    out += nlohmann::json(tok).dump();
    out += ": ";
    out += std::to_string(id);
  }
  out += "}";
  return out;
}

std::string vocab_bpe(const BpeModel& m) {
  std::string out = "#version: 0.2\n";
  for (const auto& [a, b] : m.merges) {
    out += unicode_form(m.vocab[a]);
    out += ' ';
    out += unicode_form(m.vocab[b]);
    out += '\n';
  }
  return out;
}

void write_gpt2_tokenizer(const BpeModel& m, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("tokenizer train: cannot create ", dir, ": ", ec.message());
  write_file_atomic((std::filesystem::path(dir) / "encoder.json").string(), encoder_json(m));
  write_file_atomic((std::filesystem::path(dir) / "vocab.bpe").string(), vocab_bpe(m));
}

}  // namespace jtok
