#include "ops/bf16_weights.h"

#include <unordered_map>

#include "core/profile.h"
#include "ops/lowp_linear.h"

namespace jtok {

namespace {

struct Key {
  const float* w;
  int64_t rows, cols;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    return std::hash<const void*>()(k.w) ^ (static_cast<size_t>(k.rows) * 1000003u) ^ static_cast<size_t>(k.cols);
  }
};
struct Copy {
  std::vector<uint16_t> data;  // kept across scopes: no new pages each step
  uint64_t scope = 0;          // the scope that last converted it
};

// Per thread: a trainer runs its products on one thread, and no lock is needed.
struct Cache {
  std::unordered_map<Key, Copy, KeyHash> copies;
  uint64_t scope = 0;  // the open scope's number
  int depth = 0;
  int64_t conversions = 0;
};
thread_local Cache t_cache;

}  // namespace

Bf16WeightScope::Bf16WeightScope() {
  if (t_cache.depth++ == 0) ++t_cache.scope;
}

Bf16WeightScope::~Bf16WeightScope() {
  if (--t_cache.depth > 0) return;
  // Unread in this scope and the one before: a freed model's (two models stepping in turn, as
  // bench-train --variant runs them, keep theirs).
  std::erase_if(t_cache.copies, [](const auto& kv) { return kv.second.scope + 1 < t_cache.scope; });
}

bool bf16_weight_scope_open() { return t_cache.depth > 0; }

const uint16_t* bf16_weight(const float* W, int64_t rows, int64_t cols, std::vector<uint16_t>& scratch) {
  Cache& c = t_cache;
  std::vector<uint16_t>* dst = &scratch;
  if (c.depth > 0) {
    Copy& e = c.copies[Key{W, rows, cols}];
    if (e.scope == c.scope) return e.data.data();
    e.scope = c.scope;
    ++c.conversions;
    dst = &e.data;
  }
  JTOK_PROFILE("bf16_convert_weight");
  dst->resize(static_cast<size_t>(rows * cols));
  quantize_bf16_rows(dst->data(), W, rows, cols, cols);
  return dst->data();
}

int64_t bf16_weight_conversions() { return t_cache.conversions; }

}  // namespace jtok
