#include "serve/prefix_cache.h"

#include <cstring>

#include "core/error.h"

namespace jtok {

PrefixCache::PrefixCache(int64_t block, Decoder& decoder) : block_(block), decoder_(decoder) {
  if (block < 1) fail("the prefix block must be at least 1 token, got ", block);
  if (block % decoder.block_granule() != 0)
    fail("the prefix block (", block, " tokens) must be a multiple of the decoder's ", decoder.block_granule(),
         " (", decoder.describe(), ": its KV pages are shared whole)");
}

PrefixCache::~PrefixCache() {
  for (const Block& b : blocks_)
    if (!b.tokens.empty()) decoder_.drop_block(b.kv);
}

std::vector<int64_t> PrefixCache::match_acquire(const int32_t* prompt, int64_t limit) {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<int64_t> ids;
  int64_t parent = -1;
  const int64_t t = ++tick_;
  for (int64_t j = 0; (j + 1) * block_ <= limit; ++j) {
    auto it = index_.find(Key{parent, std::vector<int32_t>(prompt + j * block_, prompt + (j + 1) * block_)});
    if (it == index_.end()) break;
    parent = it->second;
    Block& b = blocks_[static_cast<size_t>(parent)];
    b.refs++;
    b.last_used = t;
    ids.push_back(parent);
  }
  st_.tokens_reused += static_cast<int64_t>(ids.size()) * block_;
  if (!ids.empty()) st_.hits++;
  return ids;
}

int64_t PrefixCache::match_tokens(const int32_t* prompt, int64_t limit) const {
  std::lock_guard<std::mutex> lk(mu_);
  int64_t parent = -1, j = 0;
  for (; (j + 1) * block_ <= limit; ++j) {
    auto it = index_.find(Key{parent, std::vector<int32_t>(prompt + j * block_, prompt + (j + 1) * block_)});
    if (it == index_.end()) break;
    parent = it->second;
  }
  return j * block_;
}

int64_t PrefixCache::open(const std::vector<int64_t>& ids, int64_t capacity) {
  std::vector<int64_t> kv;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (int64_t id : ids) kv.push_back(blocks_[static_cast<size_t>(id)].kv);
  }
  return decoder_.open_from_blocks(kv, capacity);
}

int64_t PrefixCache::store_acquire(int64_t parent, const int32_t* tokens, int64_t seq, int64_t j, int64_t max_blocks,
                                   bool* kept) {
  if (kept) *kept = false;
  std::lock_guard<std::mutex> lk(mu_);
  Key key{parent, std::vector<int32_t>(tokens, tokens + block_)};
  const int64_t t = ++tick_;
  if (auto it = index_.find(key); it != index_.end()) {  // computed by another sequence meanwhile
    Block& b = blocks_[static_cast<size_t>(it->second)];
    b.refs++;
    b.last_used = t;
    return it->second;
  }
  while (st_.blocks >= max_blocks && evict_one()) {  // the parent is held by the caller: not evicted
  }
  if (st_.blocks >= max_blocks) return -1;
  const int64_t kv = decoder_.keep_block(seq, j * block_, block_);  // before any change: it may throw
  int64_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<int64_t>(blocks_.size());
    blocks_.emplace_back();
  }
  Block& b = blocks_[static_cast<size_t>(id)];
  b.parent = parent;
  b.refs = 1;
  b.children = 0;
  b.last_used = t;
  b.tokens = key.second;
  b.kv = kv;
  if (parent >= 0) blocks_[static_cast<size_t>(parent)].children++;
  index_.emplace(std::move(key), id);
  st_.blocks++;
  st_.stored++;
  if (kept) *kept = true;
  return id;
}

void PrefixCache::acquire(const std::vector<int64_t>& ids) {
  std::lock_guard<std::mutex> lk(mu_);
  for (int64_t id : ids) {
    Block& b = blocks_[static_cast<size_t>(id)];
    if (b.tokens.empty()) fail("prefix cache: block ", id, " is not stored");
    b.refs++;
  }
}

void PrefixCache::release(const std::vector<int64_t>& ids) {
  std::lock_guard<std::mutex> lk(mu_);
  for (int64_t id : ids) {
    Block& b = blocks_[static_cast<size_t>(id)];
    if (b.refs <= 0) fail("prefix cache: block ", id, " released more often than acquired");
    b.refs--;
  }
}

bool PrefixCache::evict_one() {
  int64_t victim = -1;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    if (b.tokens.empty() || b.refs > 0 || b.children > 0) continue;
    if (victim < 0 || b.last_used < blocks_[static_cast<size_t>(victim)].last_used) victim = static_cast<int64_t>(i);
  }
  if (victim < 0) return false;
  Block& b = blocks_[static_cast<size_t>(victim)];
  index_.erase(Key{b.parent, b.tokens});
  if (b.parent >= 0) blocks_[static_cast<size_t>(b.parent)].children--;
  decoder_.drop_block(b.kv);
  b = Block{};
  free_.push_back(victim);
  st_.blocks--;
  st_.evicted++;
  return true;
}

int64_t PrefixCache::evict_to(int64_t max_blocks) {
  std::lock_guard<std::mutex> lk(mu_);
  while (st_.blocks > max_blocks && evict_one()) {
  }
  return st_.blocks;
}

PrefixCacheStats PrefixCache::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  PrefixCacheStats s = st_;
  s.held = 0;
  for (const Block& b : blocks_) s.held += !b.tokens.empty() && b.refs > 0;
  return s;
}

}  // namespace jtok
