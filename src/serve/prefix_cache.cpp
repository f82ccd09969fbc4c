#include "serve/prefix_cache.h"

#include <cstring>

#include "core/error.h"

namespace jtok {

PrefixCache::PrefixCache(int64_t block, int64_t layers, int64_t kv_dim, bool bf16)
    : block_(block), layers_(layers), kvd_(kv_dim), bf16_(bf16) {
  if (block < 1) fail("the prefix block must be at least 1 token, got ", block);
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

void PrefixCache::load(KVCache& cache, const std::vector<int64_t>& ids, int64_t capacity) const {
  cache.bf16 = bf16_;
  kv_allocate(cache, static_cast<size_t>(layers_), kvd_, capacity);
  const int64_t n = block_ * kvd_;  // values of K (or V) of one layer in a block
  if (static_cast<int64_t>(ids.size()) * block_ > capacity)
    fail("prefix cache: ", ids.size(), " blocks do not fit a cache of ", capacity, " positions");
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t j = 0; j < ids.size(); ++j) {
    const Block& b = blocks_[static_cast<size_t>(ids[j])];
    const size_t at = j * static_cast<size_t>(n);
    for (int64_t l = 0; l < layers_; ++l) {
      const size_t src = static_cast<size_t>(l * 2 * n);
      if (bf16_) {
        std::memcpy(cache.k16[l].data() + at, b.kv16.data() + src, sizeof(uint16_t) * n);
        std::memcpy(cache.v16[l].data() + at, b.kv16.data() + src + n, sizeof(uint16_t) * n);
      } else {
        std::memcpy(cache.k[l].data() + at, b.kv.data() + src, sizeof(float) * n);
        std::memcpy(cache.v[l].data() + at, b.kv.data() + src + n, sizeof(float) * n);
      }
    }
  }
  cache.len = static_cast<int64_t>(ids.size()) * block_;
}

int64_t PrefixCache::store_acquire(int64_t parent, const int32_t* tokens, const KVCache& cache, int64_t j,
                                   int64_t max_blocks) {
  if (cache.bf16 != bf16_ || static_cast<int64_t>(cache.layers()) != layers_ || cache.len < (j + 1) * block_)
    fail("prefix cache: block ", j, " is not in the cache (", cache.len, " positions, ", cache.layers(), " layers)");
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
  const int64_t n = block_ * kvd_;
  const size_t at = static_cast<size_t>(j * n);
  for (int64_t l = 0; l < layers_; ++l) {
    if (bf16_) {
      b.kv16.resize(static_cast<size_t>(layers_ * 2 * n));
      std::memcpy(b.kv16.data() + l * 2 * n, cache.k16[l].data() + at, sizeof(uint16_t) * n);
      std::memcpy(b.kv16.data() + l * 2 * n + n, cache.v16[l].data() + at, sizeof(uint16_t) * n);
    } else {
      b.kv.resize(static_cast<size_t>(layers_ * 2 * n));
      std::memcpy(b.kv.data() + l * 2 * n, cache.k[l].data() + at, sizeof(float) * n);
      std::memcpy(b.kv.data() + l * 2 * n + n, cache.v[l].data() + at, sizeof(float) * n);
    }
  }
  if (parent >= 0) blocks_[static_cast<size_t>(parent)].children++;
  index_.emplace(std::move(key), id);
  st_.blocks++;
  st_.stored++;
  return id;
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
  b = Block{};  // frees its KV
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
