// The paged KV cache's host bookkeeping (cuda/kv_pages.h): free pages kept sorted high to low, so
// the back is the lowest id and a sequence's pages come out in ascending order while the pool is
// unfragmented. A failed open or fork changes nothing.
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

int64_t KvPages::open(int64_t capacity) {
  const int64_t need = pages_for(capacity);
  const auto slot = std::find_if(seqs_.begin(), seqs_.end(), [](const Seq& s) { return !s.open; });
  if (slot == seqs_.end())
    fail("KV pages: no free sequence handle for ", capacity, " positions (all ", max_seqs(), " are open)");
  if (need > free_pages())
    fail("KV pages: ", capacity, " positions need ", need, " pages of ", page_tokens_, ", ", free_pages(),
         " free");
  Seq& s = *slot;
  s.open = true;
  s.length = 0;
  s.capacity = capacity;
  s.pages.assign(free_.end() - need, free_.end());
  std::reverse(s.pages.begin(), s.pages.end());  // lowest id first
  free_.resize(free_.size() - static_cast<size_t>(need));
  return slot - seqs_.begin();
}

void KvPages::close(int64_t seq) {
  at(seq);  // names an unknown handle
  Seq& s = seqs_[static_cast<size_t>(seq)];
  free_.insert(free_.end(), s.pages.begin(), s.pages.end());
  std::sort(free_.begin(), free_.end(), std::greater<int32_t>());
  s = Seq{};
}

int64_t KvPages::fork(int64_t seq, int64_t capacity, std::vector<std::pair<int32_t, int32_t>>& copies) {
  const int64_t len = at(seq).length;
  if (capacity < len) fail("KV pages: fork of sequence ", seq, " (", len, " positions) into a capacity of ", capacity);
  const int64_t child = open(capacity);  // seqs_ never grows: references into it stay valid
  const Seq& src = seqs_[static_cast<size_t>(seq)];
  Seq& dst = seqs_[static_cast<size_t>(child)];
  dst.length = len;
  copies.clear();
  for (int64_t p = 0; p < pages_for(len); ++p)
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

int64_t KvPages::length(int64_t seq) const { return at(seq).length; }
int64_t KvPages::capacity(int64_t seq) const { return at(seq).capacity; }
const std::vector<int32_t>& KvPages::pages(int64_t seq) const { return at(seq).pages; }
int64_t KvPages::free_pages() const { return static_cast<int64_t>(free_.size()); }

}  // namespace jtok::cuda
