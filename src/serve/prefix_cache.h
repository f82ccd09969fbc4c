// Prefix reuse for the serving engine: the keys and values of whole prompt blocks (`block` tokens
// at positions [j * block, (j + 1) * block)) kept after they are computed, so that a later prompt
// beginning with the same tokens starts from them instead of prefilling them again.
//
// A block is named by its tokens and its parent (the stored block before it), so a match is always a
// whole prefix: block j matches only if blocks 0..j-1 did (vLLM's chained block hash, here an exact
// key, so no collision can hand out another prompt's KV). The KV at position t depends only on tokens
// 0..t, and the engine computes every prompt in the same block-aligned pieces, so a block has the
// same bits whichever sequence computed it.
//
// Reference counts: a block is held by the running sequences that matched or stored it (BlockHold);
// only a block nobody holds and with no stored child can be evicted, least recently used first, so a
// prefix stays as long as any block after it does. A block's keys and values are the decoder's
// (Decoder::keep_block: opaque here); a prompt starts from its matched blocks as a new decoder
// sequence (Decoder::open_from_blocks). The CPU decoder copies them in and out: a stored block
// costs `block` token slots of the KV budget on top of the sequences' own caches. The GPU decoder
// shares its KV pages (Decoder::blocks_shared): a block costs its slots once, however many
// sequences map it, and they do not count them.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "infer/decoder.h"

namespace jtok {

struct PrefixCacheStats {
  int64_t blocks = 0;         // gauge: blocks stored
  int64_t held = 0;           // gauge: blocks held by a running sequence (not evictable)
  int64_t stored = 0;         // blocks ever stored
  int64_t evicted = 0;        // blocks evicted (least recently used first)
  int64_t tokens_reused = 0;  // prompt tokens taken from stored blocks instead of prefilled
  int64_t hits = 0;           // prompts that reused at least one block
};

class PrefixCache {
 public:
  // Blocks of `block` tokens whose keys and values `decoder` keeps (it outlives the cache: the
  // destructor drops what is stored). block must be a multiple of decoder.block_granule().
  PrefixCache(int64_t block, Decoder& decoder);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;
  int64_t block() const { return block_; }
  // The longest chain of stored blocks that prompt[0..limit) begins with (whole blocks only), each
  // acquired for the caller (release them when done); empty when the first block is not stored.
  std::vector<int64_t> match_acquire(const int32_t* prompt, int64_t limit);
  // The tokens match_acquire would reuse now (whole blocks), acquiring nothing and leaving the
  // recency order as it is: what an admitted prompt will most likely not prefill.
  int64_t match_tokens(const int32_t* prompt, int64_t limit) const;
  // A new decoder sequence of `capacity` positions starting with the blocks ids (a chain from
  // match_acquire): positions [0, ids.size() * block) (Decoder::open_from_blocks).
  int64_t open(const std::vector<int64_t>& ids, int64_t capacity);
  // Stores block j of decoder sequence seq (its tokens tokens[0..block), positions [j * block, (j +
  // 1) * block)), the child of `parent` (-1: block 0), and acquires it: an equal stored block, or a
  // new one kept from seq (*kept = true) when fewer than max_blocks are stored after evicting what
  // may be. -1 when there is no room.
  int64_t store_acquire(int64_t parent, const int32_t* tokens, int64_t seq, int64_t j, int64_t max_blocks,
                        bool* kept = nullptr);
  void acquire(const std::vector<int64_t>& ids);  // held once more each (a fork that maps them too)
  void release(const std::vector<int64_t>& ids);
  // Evicts unheld childless blocks, least recently used first, until at most max_blocks are stored or
  // none is evictable; returns the blocks left.
  int64_t evict_to(int64_t max_blocks);
  PrefixCacheStats stats() const;

 private:
  struct Block {
    int64_t parent = -1, refs = 0, children = 0, last_used = 0;
    std::vector<int32_t> tokens;     // empty: a free slot
    int64_t kv = -1;                 // the decoder's block handle
  };
  using Key = std::pair<int64_t, std::vector<int32_t>>;  // (parent, tokens)
  bool evict_one();  // the least recently used evictable block; false when there is none
  int64_t block_;
  Decoder& decoder_;
  mutable std::mutex mu_;
  std::vector<Block> blocks_;
  std::vector<int64_t> free_;
  std::map<Key, int64_t> index_;
  int64_t tick_ = 0;
  PrefixCacheStats st_;
};

// The blocks one sequence holds: released when it ends (it moves with the sequence).
class BlockHold {
 public:
  BlockHold() = default;
  BlockHold(BlockHold&& o) noexcept : cache_(o.cache_), ids_(std::move(o.ids_)) { o.cache_ = nullptr; }
  BlockHold& operator=(BlockHold&& o) noexcept {
    if (this != &o) {
      reset();
      cache_ = o.cache_;
      ids_ = std::move(o.ids_);
      o.cache_ = nullptr;
    }
    return *this;
  }
  BlockHold(const BlockHold&) = delete;
  BlockHold& operator=(const BlockHold&) = delete;
  ~BlockHold() { reset(); }
  void hold(PrefixCache* c, int64_t id) {  // an id acquired from c
    cache_ = c;
    ids_.push_back(id);
  }
  // The same blocks acquired once more (a fork that maps them): an empty hold when o is.
  BlockHold share() const {
    BlockHold h;
    if (!cache_ || ids_.empty()) return h;
    cache_->acquire(ids_);
    h.cache_ = cache_;
    h.ids_ = ids_;
    return h;
  }
  const std::vector<int64_t>& ids() const { return ids_; }
  void reset() {
    if (cache_ && !ids_.empty()) cache_->release(ids_);
    ids_.clear();
  }

 private:
  PrefixCache* cache_ = nullptr;
  std::vector<int64_t> ids_;
};

}  // namespace jtok
