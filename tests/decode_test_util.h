// Batch invariance of decode_batch (infer/generate.h): each sequence's logits have the same bits
// whatever other sequences share its step. Shared by test_generate (fp32 models) and test_lowp_model
// (bf16 / int8 copies).
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "infer/generate.h"

namespace jtok::testing {

// Prefills 20 prompts of different lengths, then for batch sizes M crossing every kernel threshold
// (4: f32 register tile vs sgemm, 16: kLowpGemvRows) decodes sequences 0..M-1 (next tokens of
// different ids, repeats included, at different positions) in one decode_batch and each alone with
// decode_step from a copy of its cache: every row's logits equal bit for bit.
inline void expect_decode_batch_invariant(const Model& m) {
  const int64_t V = m.cfg.vocab_size, n_seq = 20;
  std::vector<KVCache> caches(static_cast<size_t>(n_seq));
  std::vector<int32_t> next(static_cast<size_t>(n_seq));
  for (int64_t s = 0; s < n_seq; ++s) {
    std::vector<int32_t> prompt;
    for (int64_t j = 0; j <= s % 7; ++j) prompt.push_back(static_cast<int32_t>((s * 31 + j * 17 + 3) % V));
    prefill(m, caches[s], prompt, 24);
    next[s] = static_cast<int32_t>((s % 5 == 4 ? 7 : s * 13 + 1) % V);  // some ids repeat within a step
  }
  for (int64_t M : {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 20}) {
    std::vector<KVCache> together(caches.begin(), caches.begin() + M);
    std::vector<KVCache*> ptrs;
    for (auto& c : together) ptrs.push_back(&c);
    std::vector<float> logits(static_cast<size_t>(M * V));
    decode_batch(m, ptrs.data(), next.data(), M, logits.data());
    for (int64_t s = 0; s < M; ++s) {
      KVCache alone = caches[s];
      const std::vector<float> want = decode_step(m, alone, next[s]);
      int64_t differ = 0;
      for (int64_t v = 0; v < V; ++v) differ += std::memcmp(&want[v], &logits[s * V + v], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0) << "batch of " << M << ", sequence " << s << ": " << differ << " of " << V
                           << " logits differ in their bits from the sequence decoded alone";
      EXPECT_TRUE(alone.k == together[s].k && alone.v == together[s].v)
          << "batch of " << M << ", sequence " << s << ": the cached keys or values differ";
    }
  }
}

}  // namespace jtok::testing
