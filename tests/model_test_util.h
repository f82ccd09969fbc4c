// Helpers for whole-model tests: random token ids, and the gradient-accumulation check.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "model/transformer.h"
#include "op_test_util.h"

namespace jtok::testing {

inline std::vector<int32_t> tokens(int64_t n, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
  return t;
}

// Two micro-batches of (B,T), each backpropagated with scale 1/2, give the loss and gradients of
// one (2B,T) batch.
inline void expect_accumulation_equals_big_batch(Model& m, int64_t B, int64_t T) {
  const int64_t V = m.cfg.vocab_size;
  auto x = tokens(2 * B * T, V, 4), y = tokens(2 * B * T, V, 5);
  Activations a;
  zero_grads(m);
  forward(m, a, x.data(), 2 * B, T);
  double big = backward(m, a, x.data(), y.data());
  auto g_big = m.grads;
  zero_grads(m);
  Activations a2;
  double acc = 0;
  for (int mb = 0; mb < 2; ++mb) {
    forward(m, a2, x.data() + mb * B * T, B, T);
    acc += backward(m, a2, x.data() + mb * B * T, y.data() + mb * B * T, 0.5f) / 2;
  }
  EXPECT_NEAR(acc, big, 1e-5);
  EXPECT_LT(rel_err(m.grads, g_big), 1e-5);
}

}  // namespace jtok::testing
