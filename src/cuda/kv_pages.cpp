// The paged KV cache's host bookkeeping (cuda/kv_pages.h): free pages kept sorted high to low, so
// the back is the lowest id and a sequence's new pages come out in ascending order while the pool is
// unfragmented; a holder count a page. A failed open, fork, open_from or keep changes nothing.
#include "cuda/kv_pages.h"

#include <algorithm>
#include <functional>
#include <limits>

#include "core/error.h"

namespace jtok::cuda {

KvPages::KvPages(int64_t n_pages, int64_t page_tokens, int64_t max_seqs) : page_tokens_(page_tokens) {
  if (n_pages < 0 || n_pages > std::numeric_limits<int32_t>::max())
    fail("KV pages: ", n_pages, " pages (0 .. 2^31-1: page ids are int32)");
  if (page_tokens <= 0) fail("KV pages: ", page_tokens, " positions a page (must be positive)");
  if (max_seqs <= 0) fail("KV pages: ", max_seqs, " sequences at most (must be positive)");
  free_.resize(static_cast<size_t>(n_pages));
  for (int64_t i = 0; i < n_pages; ++i) free_[static_cast<size_t>(i)] = static_cast<int32_t>(n_pages - 1 - i);
  refs_.assign(static_cast<size_t>(n_pages), 0);
  seqs_.resize(static_cast<size_t>(max_seqs));
}

int64_t KvPages::pages_for(int64_t capacity) const {
  if (capacity < 0) fail("KV pages: a capacity of ", capacity, " positions");
  return (capacity + page_tokens_ - 1) / page_tokens_;
}

const KvPages::Seq& KvPages::at(int64_t seq) const {
  if (!is_open(seq)) fail("KV pages: sequence handle ", seq, " is not open (handles 0..", max_seqs() - 1, ")");
  return seqs_[static_cast<size_t>(seq)];
}

bool KvPages::is_open(int64_t seq) const {
  return seq >= 0 && seq < max_seqs() && seqs_[static_cast<size_t>(seq)].open;
}

int64_t KvPages::make_seq(int64_t capacity, const std::vector<int32_t>& layout) {
  const int64_t total = pages_for(capacity);
  const auto slot = std::find_if(seqs_.begin(), seqs_.end(), [](const Seq& s) { return !s.open; });
  if (slot == seqs_.end())
    fail("KV pages: no free sequence handle for ", capacity, " positions (all ", max_seqs(), " are open)");
  int64_t need = total;
  for (int64_t p = 0; p < std::min<int64_t>(total, static_cast<int64_t>(layout.size())); ++p)
    need -= layout[static_cast<size_t>(p)] >= 0;
  if (need > free_pages())
    fail("KV pages: ", capacity, " positions need ", need, " pages of ", page_tokens_, ", ", free_pages(), " free");
  Seq& s = *slot;
  s.open = true;
  s.length = 0;
  s.capacity = capacity;
  s.pages.resize(static_cast<size_t>(total));
  for (int64_t p = 0; p < total; ++p) {
    int32_t page = p < static_cast<int64_t>(layout.size()) ? layout[static_cast<size_t>(p)] : -1;
    if (page < 0) {
      page = free_.back();
      free_.pop_back();
    }
    refs_[static_cast<size_t>(page)]++;
    s.pages[static_cast<size_t>(p)] = page;
  }
  return slot - seqs_.begin();
}

int64_t KvPages::open(int64_t capacity) { return make_seq(capacity, {}); }

void KvPages::let_go(const std::vector<int32_t>& pages) {
  bool freed = false;
  for (int32_t p : pages)
    if (--refs_[static_cast<size_t>(p)] == 0) {
      free_.push_back(p);
      freed = true;
    }
  if (freed) std::sort(free_.begin(), free_.end(), std::greater<int32_t>());
}

void KvPages::close(int64_t seq) {
  at(seq);  // names an unknown handle
  Seq& s = seqs_[static_cast<size_t>(seq)];
  let_go(s.pages);
  s = Seq{};
}

int64_t KvPages::fork(int64_t seq, int64_t capacity, std::vector<std::pair<int32_t, int32_t>>& copies) {
  const int64_t len = at(seq).length;
  if (capacity < len) fail("KV pages: fork of sequence ", seq, " (", len, " positions) into a capacity of ", capacity);
  const int64_t written = pages_for(len);
  std::vector<int32_t> layout(static_cast<size_t>(written), -1);  // the parent's shared pages mapped
  for (int64_t p = 0; p < written; ++p) {
    const int32_t page = seqs_[static_cast<size_t>(seq)].pages[static_cast<size_t>(p)];
    if (refs_[static_cast<size_t>(page)] > 1) layout[static_cast<size_t>(p)] = page;
  }
  const int64_t child = make_seq(capacity, layout);  // seqs_ never grows: references into it stay valid
  const Seq& src = seqs_[static_cast<size_t>(seq)];
  Seq& dst = seqs_[static_cast<size_t>(child)];
  dst.length = len;
  copies.clear();
  for (int64_t p = 0; p < written; ++p)
    if (layout[static_cast<size_t>(p)] < 0)
      copies.emplace_back(src.pages[static_cast<size_t>(p)], dst.pages[static_cast<size_t>(p)]);
  return child;
}

void KvPages::advance(int64_t seq, int64_t n) {
  const Seq& s = at(seq);
  if (n < 0 || s.length + n > s.capacity)
    fail("KV pages: sequence ", seq, " at ", s.length, " positions cannot advance by ", n, " (capacity ", s.capacity,
         ")");
  seqs_[static_cast<size_t>(seq)].length += n;
}

const KvPages::Block& KvPages::block_at(int64_t block) const {
  if (!is_block(block))
    fail("KV pages: block handle ", block, " is not stored (", blocks(), " blocks are)");
  return blocks_[static_cast<size_t>(block)];
}

bool KvPages::is_block(int64_t block) const {
  return block >= 0 && block < static_cast<int64_t>(blocks_.size()) && blocks_[static_cast<size_t>(block)].live;
}

int64_t KvPages::keep(int64_t seq, int64_t first, int64_t n) {
  const Seq& s = at(seq);
  if (first < 0 || n <= 0 || first % page_tokens_ != 0 || n % page_tokens_ != 0 || first + n > s.length)
    fail("KV pages: positions [", first, ", ", first + n, ") of sequence ", seq, " (", s.length,
         " written) are no whole pages of ", page_tokens_, " written: they cannot be a stored block");
  auto slot = std::find_if(blocks_.begin(), blocks_.end(), [](const Block& b) { return !b.live; });
  if (slot == blocks_.end()) slot = blocks_.insert(blocks_.end(), Block{});
  slot->live = true;
  slot->pages.assign(s.pages.begin() + first / page_tokens_, s.pages.begin() + (first + n) / page_tokens_);
  for (int32_t p : slot->pages) refs_[static_cast<size_t>(p)]++;
  return slot - blocks_.begin();
}

void KvPages::drop(int64_t block) {
  block_at(block);  // names an unknown handle
  Block& b = blocks_[static_cast<size_t>(block)];
  let_go(b.pages);
  b = Block{};
}

int64_t KvPages::open_from(const std::vector<int64_t>& blocks, int64_t capacity) {
  std::vector<int32_t> layout;
  for (int64_t b : blocks) {
    const std::vector<int32_t>& pages = block_at(b).pages;
    layout.insert(layout.end(), pages.begin(), pages.end());
  }
  const int64_t mapped = static_cast<int64_t>(layout.size()) * page_tokens_;
  if (capacity < mapped)
    fail("KV pages: ", blocks.size(), " blocks of ", mapped, " positions do not fit a capacity of ", capacity);
  const int64_t seq = make_seq(capacity, layout);
  seqs_[static_cast<size_t>(seq)].length = mapped;
  return seq;
}

int64_t KvPages::length(int64_t seq) const { return at(seq).length; }
int64_t KvPages::capacity(int64_t seq) const { return at(seq).capacity; }
const std::vector<int32_t>& KvPages::pages(int64_t seq) const { return at(seq).pages; }
int64_t KvPages::free_pages() const { return static_cast<int64_t>(free_.size()); }
const std::vector<int32_t>& KvPages::block_pages(int64_t block) const { return block_at(block).pages; }
int64_t KvPages::blocks() const {
  return std::count_if(blocks_.begin(), blocks_.end(), [](const Block& b) { return b.live; });
}
int32_t KvPages::refs(int32_t page) const {
  if (page < 0 || page >= static_cast<int32_t>(refs_.size())) fail("KV pages: no page ", page);
  return refs_[static_cast<size_t>(page)];
}

}  // namespace jtok::cuda
