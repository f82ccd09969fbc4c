// Training a byte-level BPE tokenizer of our own (`jtok tokenizer train`), in GPT-2's format.
//
// Text -> GPT-2's pre-tokenizer (data/pretokenize.h, the same split our GPT-2 tokenizer uses) ->
// counts of distinct pieces ("words") -> BPE merges: repeatedly the most frequent adjacent pair of
// symbols over all words (weighted by word count) is merged into a new token, until the
// vocabulary has vocab_size tokens. Ties between pairs of equal count go to the pair with the
// smaller (left id, right id): ids are the 256 bytes in GPT-2's byte order (ids 0-255, as in
// GPT-2's encoder.json), then new tokens in the order they were made. Words are ordered by their
// bytes, so the result depends only on the word counts and vocab_size: it is deterministic.
//
// Pair counts are kept up to date incrementally: a merge visits only the words that contain the
// pair (an index from pair to words) and changes the counts of the pairs around each occurrence;
// the next pair comes from a max-heap with lazy deletion (stale entries are skipped when popped).
//
// The last id is "<|endoftext|>", as in GPT-2, so vocab_size counts it: 256 bytes + merges + 1.
// Written as encoder.json + vocab.bpe, which Tokenizer::load(Gpt2, dir) reads unchanged.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace jtok {

// Counts of the GPT-2 pre-tokenizer's pieces of texts (invalid UTF-8 is first replaced by U+FFFD,
// as our tokenizer does).
class PieceCounter {
 public:
  void add_text(std::string_view text);
  const std::unordered_map<std::string, int64_t>& counts() const { return counts_; }
  int64_t pieces() const { return pieces_; }
  int64_t bytes() const { return bytes_; }

 private:
  std::unordered_map<std::string, int64_t> counts_;
  int64_t pieces_ = 0, bytes_ = 0;
};

struct BpeModel {
  std::vector<std::string> vocab;                 // raw bytes of each id; the last is "" (<|endoftext|>)
  std::vector<std::pair<int32_t, int32_t>> merges;  // (left id, right id), in rank order
  int32_t eot_id = -1;
};

// Fails when vocab_size < 257. If the words run out of pairs first, the vocabulary is smaller
// (every word is then one token); the result says so by its size.
BpeModel train_bpe(const std::unordered_map<std::string, int64_t>& word_counts, int64_t vocab_size);

// The bytes of encoder.json (token in GPT-2's byte-to-unicode form -> id, in id order) and of
// vocab.bpe ("#version: 0.2" then one "left right" line per merge).
std::string encoder_json(const BpeModel& m);
std::string vocab_bpe(const BpeModel& m);
// Writes both into dir (created if missing), each atomically.
void write_gpt2_tokenizer(const BpeModel& m, const std::string& dir);

// Straightforward reference: recounts every pair of every word at each step (O(merges x text));
// for tests of train_bpe on small inputs.
BpeModel train_bpe_reference(const std::unordered_map<std::string, int64_t>& word_counts, int64_t vocab_size);

}  // namespace jtok
