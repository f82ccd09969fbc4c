// The one cache index and replacement of the disk stores' DRAM caches (the serving store's token
// blocks, store/table_store.h; the training store's units, store/train_table_store.h): which key (a
// token id, a unit) each slot holds, the slot of each key, and CLOCK. A hit sets the slot's
// reference bit (touch); a claim sweeps the hand past referenced slots, clearing their bit, to the
// first unreferenced one the store does not rule out (a slot being read, a unit a step still needs).
// The slots' bytes and their read / write states are the store's. Not thread-safe: the store's
// lock guards it.
#pragma once
#include <cstdint>
#include <vector>

namespace jtok {

class ClockSlots {
 public:
  void init(int64_t slots, int64_t keys) {
    slot_key_.assign(static_cast<size_t>(slots), -1);
    referenced_.assign(static_cast<size_t>(slots), 0);
    key_slot_.assign(static_cast<size_t>(keys), -1);
    hand_ = 0;
  }
  int64_t slots() const { return static_cast<int64_t>(slot_key_.size()); }
  int32_t slot_of(int64_t key) const { return key_slot_[static_cast<size_t>(key)]; }  // -1: not cached
  int64_t key_of(int64_t slot) const { return slot_key_[static_cast<size_t>(slot)]; }  // -1: empty
  void touch(int64_t slot) { referenced_[static_cast<size_t>(slot)] = 1; }
  void bind(int64_t slot, int64_t key) {  // slot (empty) now holds key (not cached)
    slot_key_[static_cast<size_t>(slot)] = key;
    key_slot_[static_cast<size_t>(key)] = static_cast<int32_t>(slot);
  }
  void unbind(int64_t slot) {  // slot empty, its key (if any) no longer cached
    const int64_t key = slot_key_[static_cast<size_t>(slot)];
    if (key >= 0) key_slot_[static_cast<size_t>(key)] = -1;
    slot_key_[static_cast<size_t>(slot)] = -1;
    referenced_[static_cast<size_t>(slot)] = 0;
  }
  // A slot to reuse (still bound: the caller unbinds it), skipping those skip(slot) rules out; -1
  // when two sweeps (which clear every bit) find none.
  template <class Skip>
  int64_t claim(Skip skip) {
    const int64_t n = slots();
    for (int64_t i = 0; i < 2 * n + 1; ++i) {
      const int64_t h = hand_;
      hand_ = (hand_ + 1) % n;
      if (skip(h)) continue;
      if (referenced_[static_cast<size_t>(h)]) {
        referenced_[static_cast<size_t>(h)] = 0;
        continue;
      }
      return h;
    }
    return -1;
  }

 private:
  std::vector<int64_t> slot_key_;   // (slots) key in each slot, or -1
  std::vector<int32_t> key_slot_;   // (keys) slot of each key, or -1
  std::vector<uint8_t> referenced_;
  int64_t hand_ = 0;
};

}  // namespace jtok
