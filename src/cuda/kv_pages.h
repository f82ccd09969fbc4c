// The paged KV cache's bookkeeping on the host (issue 40): a pool of n_pages pages of page_tokens
// positions each, handed to sequences whole. A sequence's position p lives in page pages(seq)[p /
// page_tokens], slot p % page_tokens (cuda/paged_kv.h's layout). Pages are reserved for a sequence's
// whole capacity when it opens, so a step never runs out of pages mid-way. Plain C++ (jtok_lib, every
// build): the GPU decoder (cuda/decoder.cu) keeps the device copy of the page tables in step with it.
//
// Prefix blocks (the serving engine's prefix reuse): keep() makes whole pages of a sequence's written
// positions a stored block; open_from() starts a sequence whose first pages are blocks' pages, mapped,
// not copied; fork() maps the pages its parent shares instead of copying them. A page is counted by
// its holders (sequences and blocks) and is free again when the last lets it go. Only whole pages
// below a sequence's length are ever shared, and a sequence only writes at its length and after, so a
// shared page is never written again: no copy on write is needed.
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
  void close(int64_t seq);  // lets its pages go (free once nothing else holds them); an unknown handle fails naming it
  // A new sequence of capacity >= length(seq) holding seq's positions: the pages seq shares (held by
  // another sequence or a block) are mapped, the others are new, and `copies` is set to the (src,
  // dst) page pairs whose contents the caller copies (the new pages holding positions 0..length(seq)-1).
  int64_t fork(int64_t seq, int64_t capacity, std::vector<std::pair<int32_t, int32_t>>& copies);
  // Moves seq's length on by n (positions written); past its capacity fails naming both.
  void advance(int64_t seq, int64_t n);
  int64_t length(int64_t seq) const;
  int64_t capacity(int64_t seq) const;  // as asked at open / fork
  const std::vector<int32_t>& pages(int64_t seq) const;
  bool is_open(int64_t seq) const;
  int64_t free_pages() const;  // pages nothing holds
  int64_t page_tokens() const { return page_tokens_; }
  int64_t max_seqs() const { return static_cast<int64_t>(seqs_.size()); }
  // Pages a sequence of `capacity` positions takes: ceil(capacity / page_tokens).
  int64_t pages_for(int64_t capacity) const;

  // A stored block of seq's positions [first, first + n): its pages, now held by the block too; its
  // handle (the lowest free one). first and n must be multiples of page_tokens, n > 0, and the
  // positions written (first + n <= length(seq)); anything else fails naming them.
  int64_t keep(int64_t seq, int64_t first, int64_t n);
  void drop(int64_t block);  // the block lets its pages go; an unknown handle fails naming it
  // A new sequence whose positions [0, m) are blocks[0..k)'s pages in order (m: their positions, its
  // length), with pages of its own for positions m..capacity-1. Fails (taking nothing) as open does.
  int64_t open_from(const std::vector<int64_t>& blocks, int64_t capacity);
  const std::vector<int32_t>& block_pages(int64_t block) const;
  bool is_block(int64_t block) const;
  int64_t blocks() const;        // stored blocks
  int32_t refs(int32_t page) const;  // its holders, sequences and blocks (0: free)

 private:
  struct Seq {
    bool open = false;
    int64_t length = 0, capacity = 0;
    std::vector<int32_t> pages;
  };
  struct Block {
    bool live = false;
    std::vector<int32_t> pages;
  };
  const Seq& at(int64_t seq) const;
  const Block& block_at(int64_t block) const;
  // A free handle with ceil(capacity / page_tokens) pages: layout[p] where it is >= 0 (a page held
  // elsewhere, gaining a holder; layout may be shorter), a new page elsewhere (lowest ids first);
  // length 0. Fails, changing nothing, naming the positions, the new pages asked and the pages free.
  int64_t make_seq(int64_t capacity, const std::vector<int32_t>& layout);
  void let_go(const std::vector<int32_t>& pages);  // one holder less each; free at none
  int64_t page_tokens_ = 0;
  std::vector<int32_t> free_;  // free page ids; taken from the back, lowest ids first
  std::vector<int32_t> refs_;  // (n_pages) holders of each page
  std::vector<Seq> seqs_;
  std::vector<Block> blocks_;  // grows; handles reused lowest first
};

}  // namespace jtok::cuda
