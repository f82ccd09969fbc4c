// Byte-level BPE: the vocabulary is a list of byte strings, merges are ranked pairs of ids.
// encode_piece() turns one pre-tokenized piece (raw bytes) into ids by repeatedly merging the
// adjacent pair of lowest rank, leftmost first (the rule of GPT-2's encoder.py and of HF BPE).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace jtok {

// GPT-2's reversible map from bytes to printable unicode characters (vocab files store tokens
// in this form): byte b -> code point.
uint32_t byte_to_unicode(uint8_t b);
// Inverse: a token string in that form -> raw bytes. Returns false if a char is not in the map.
bool unicode_token_to_bytes(std::string_view token, std::string& bytes);

class Bpe {
 public:
  // vocab[id] = raw bytes of the token (may be empty for ids that are not BPE tokens).
  // merges: pairs of raw byte strings, best first.
  // errors are reported as "<where>: ..." via jtok::fail.
  void build(std::vector<std::string> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
             const std::string& where);

  // Appends the ids of one piece (1 or more raw bytes).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  const std::string& token_bytes(int32_t id) const { return vocab_[id]; }
  size_t size() const { return vocab_.size(); }

 private:
  struct Slot { uint64_t key; uint32_t rank; int32_t merged; };
  // Open-addressing table of merges keyed by (left id << 32 | right id).
  std::vector<Slot> table_;
  uint64_t mask_ = 0;
  uint64_t generation_ = 0;  // distinguishes Bpe objects in the per-thread cache
  std::vector<std::string> vocab_;
  int32_t byte_id_[256];
  bool find(uint64_t key, uint32_t& rank, int32_t& merged) const;
  void encode_uncached(std::string_view piece, std::vector<int32_t>& out) const;
};

}  // namespace jtok
