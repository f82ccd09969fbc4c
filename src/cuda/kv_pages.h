// The paged KV cache's bookkeeping on the host (issue 40): a pool of n_pages pages of page_tokens
// positions each, handed to sequences whole. A sequence's position p lives in page pages(seq)[p /
// page_tokens], slot p % page_tokens (cuda/paged_kv.h's layout). Pages are reserved for a sequence's
// whole capacity when it opens, so a step never runs out of pages mid-way. Plain C++ (jtok_lib, every
// build): the GPU decoder (cuda/decoder.cu) keeps the device copy of the page tables in step with it.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace jtok::cuda {

class KvPages {
 public:
  // max_seqs: sequences open at once at most (handles 0..max_seqs-1, reused after close).
  KvPages(int64_t n_pages, int64_t page_tokens, int64_t max_seqs);
  // A new empty sequence with ceil(capacity / page_tokens) pages: its handle, the lowest free one.
  // Throws jtok::Error naming the positions, the pages asked and the pages free (or the handles).
  int64_t open(int64_t capacity);
  void close(int64_t seq);  // its pages back to the pool; an unknown handle fails naming it
  // A new sequence of capacity >= length(seq) holding seq's positions: `copies` is set to the (src,
  // dst) page pairs whose contents the caller copies (the pages holding positions 0..length(seq)-1).
  int64_t fork(int64_t seq, int64_t capacity, std::vector<std::pair<int32_t, int32_t>>& copies);
  // Moves seq's length on by n (positions written); past its capacity fails naming both.
  void advance(int64_t seq, int64_t n);
  int64_t length(int64_t seq) const;
  int64_t capacity(int64_t seq) const;  // as asked at open / fork
  const std::vector<int32_t>& pages(int64_t seq) const;
  bool is_open(int64_t seq) const;
  int64_t free_pages() const;
  int64_t page_tokens() const { return page_tokens_; }
  int64_t max_seqs() const { return static_cast<int64_t>(seqs_.size()); }
  // Pages a sequence of `capacity` positions takes: ceil(capacity / page_tokens).
  int64_t pages_for(int64_t capacity) const;

 private:
  struct Seq {
    bool open = false;
    int64_t length = 0, capacity = 0;
    std::vector<int32_t> pages;
  };
  const Seq& at(int64_t seq) const;
  int64_t page_tokens_ = 0;
  std::vector<int32_t> free_;  // free page ids; taken from the back, lowest ids first
  std::vector<Seq> seqs_;
};

}  // namespace jtok::cuda
