// The serving engine's prefix reuse (serve/engine.h): prompts prefilled in whole blocks, stored
// blocks looked up at a prompt's first piece and its sequence opened from them, its whole blocks
// stored after each piece, and the KV budget's room for them.
#include <chrono>

#include "serve/engine.h"

namespace jtok {

// Pieces of prefix_block tokens at positions that are multiples of it (the last of a prompt shorter),
// as many as fit in prefill_chunk tokens; a prompt looks its stored blocks up at its first piece,
// after the pieces before it this step were stored.
int64_t Engine::prefill_step_blocks(std::vector<std::unique_ptr<Active>>& forked) {
  const int64_t b = opt_.prefix_block;
  int64_t left = opt_.prefill_chunk, prefetched = 0;
  for (auto& ap : prefilling_) {
    Active& a = *ap;
    const int64_t P = static_cast<int64_t>(a.req.prompt.size());
    if (!a.started) {
      if (left < std::min(b, P)) break;
      start_from_prefix(a);
    }
    while (a.prefilled < P && !a.seq->done) {
      const int64_t n = std::min(b, P - a.prefilled);
      if (n > left) return prefetched;
      prefetched += prefetch(a.req.prompt.data() + a.prefilled, n);
      prefill_piece(a, n, forked);
      left -= n;
    }
  }
  return prefetched;
}

void Engine::start_from_prefix(Active& a) {
  a.started = true;
  if (!a.req.prompt_logprobs) load_prefix(a);  // else every position's logits are asked for: all computed
  if (opt_.prefetch && a.prefilled < a.announced_from)
    prefetch_disk_rows(model_, a.req.prompt.data() + a.prefilled, a.announced_from - a.prefilled);
}

void Engine::load_prefix(Active& a) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t P = static_cast<int64_t>(a.req.prompt.size());
  for (int64_t id : prefix_->match_acquire(a.req.prompt.data(), P - 1)) a.blocks.hold(prefix_.get(), id);
  if (a.blocks.ids().empty()) return;
  try {
    a.kv = DecoderSeq(decoder_.get(), prefix_->open(a.blocks.ids(), P + a.req.max_tokens));
  } catch (const std::exception&) {  // no memory for it: prefilled from the start (which reports it)
    a.blocks.reset();
    return;
  }
  a.prefilled = a.cached = static_cast<int64_t>(a.blocks.ids().size()) * prefix_->block();
  // Shared: every choice maps these positions (the forks too): they are the blocks' slots, not its.
  if (decoder_->blocks_shared()) unreserve(a, (1 + static_cast<int64_t>(a.others.size())) * a.cached);
  a.prefill_sec += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A block costs `b` slots beside the sequences'; on a shared decoder one kept from a's own positions
// is mapped by each of a's choices (the forks to come too), whose reservations drop by b each.
void Engine::store_blocks(Active& a) {
  const int64_t b = prefix_->block();
  auto j = static_cast<int64_t>(a.blocks.ids().size());
  const int64_t freed = decoder_->blocks_shared() ? (1 + static_cast<int64_t>(a.others.size())) * b : 0;
  for (; a.storing && (j + 1) * b <= a.prefilled; ++j) {
    int64_t room;
    {
      std::lock_guard<std::mutex> lk(mu_);
      room = opt_.kv_budget_tokens - stats_.kv_tokens_used + freed;
    }
    const int64_t parent = j == 0 ? -1 : a.blocks.ids().back();
    bool kept = false;
    const int64_t id = prefix_->store_acquire(parent, a.req.prompt.data() + j * b, a.kv.id(), j, room / b, &kept);
    if (id < 0) {
      a.storing = false;  // no room: its later blocks would have no parent
      continue;
    }
    a.blocks.hold(prefix_.get(), id);
    if (kept && freed > 0) unreserve(a, freed);
  }
}

void Engine::unreserve(Active& a, int64_t n) {
  a.need -= n;
  std::lock_guard<std::mutex> lk(mu_);
  stats_.kv_tokens_used -= n;
}

bool Engine::kv_fits(int64_t need) {
  const int64_t room = opt_.kv_budget_tokens - stats_.kv_tokens_used - need;
  if (room < 0) return false;
  if (!prefix_) return true;
  return prefix_->evict_to(room / prefix_->block()) * prefix_->block() <= room;
}

}  // namespace jtok
