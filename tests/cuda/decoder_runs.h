// The GPU decoder tests' runs (test_cuda_decoder.cpp, test_cuda_decoder_q8.cpp): prompts prefilled
// one sequence at a time, then greedy decode steps of all of them together, on the CPU engine
// (prefill, decode_batch) or a DeviceDecoder, each step's tokens, logits and token-table rows kept.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/decoder.h"
#include "infer/generate.h"
#include "model/transformer.h"

namespace jtok::cuda_test {

constexpr int64_t kContext = 64;  // model_case.h's max_position_embeddings

inline int32_t argmax(const float* x, int64_t n) { return static_cast<int32_t>(std::max_element(x, x + n) - x); }

// One run: each prompt's prefill logits, then steps of all sequences together (tokens fed, logits,
// rows read).
struct Run {
  std::vector<std::vector<float>> prefill;  // per sequence (V)
  std::vector<std::vector<int32_t>> fed;    // per step (M)
  std::vector<std::vector<float>> logits;   // per step (M, V)
  std::vector<int64_t> rows;                // per step
};

// The next tokens: forced (another run's) at step s, or each row's argmax of `last`.
inline std::vector<int32_t> next_tokens(const std::vector<float>& last, int64_t M, int64_t V, const Run* force, int s) {
  if (force) return force->fed[static_cast<size_t>(s)];
  std::vector<int32_t> t(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i) t[static_cast<size_t>(i)] = argmax(last.data() + i * V, V);
  return t;
}
inline std::vector<float> concat(const std::vector<std::vector<float>>& rows) {
  std::vector<float> out;
  for (const auto& r : rows) out.insert(out.end(), r.begin(), r.end());
  return out;
}

inline Run cpu_run(const jtok::Model& m, const std::vector<std::vector<int32_t>>& ps, int steps) {
  const int64_t M = static_cast<int64_t>(ps.size()), V = m.cfg.vocab_size;
  std::vector<jtok::KVCache> caches(ps.size());
  std::vector<jtok::KVCache*> ptrs;
  Run r;
  for (size_t i = 0; i < ps.size(); ++i) {
    r.prefill.push_back(jtok::prefill(m, caches[i], ps[i], kContext));
    ptrs.push_back(&caches[i]);
  }
  std::vector<float> last = concat(r.prefill);
  for (int s = 0; s < steps; ++s) {
    r.fed.push_back(next_tokens(last, M, V, nullptr, s));
    last.assign(static_cast<size_t>(M * V), 0.0f);
    r.rows.push_back(jtok::decode_batch(m, ptrs.data(), r.fed.back().data(), M, last.data()));
    r.logits.push_back(last);
  }
  return r;
}

inline Run gpu_run(jtok::cuda::DeviceDecoder& dec, const jtok::ModelConfig& c,
                   const std::vector<std::vector<int32_t>>& ps, int steps, const Run* force = nullptr) {
  const int64_t M = static_cast<int64_t>(ps.size()), V = c.vocab_size;
  std::vector<int64_t> seqs;
  Run r;
  for (const auto& p : ps) {
    seqs.push_back(dec.open(kContext));
    r.prefill.emplace_back(static_cast<size_t>(V));
    dec.prefill(seqs.back(), p.data(), static_cast<int64_t>(p.size()), r.prefill.back().data());
    EXPECT_EQ(dec.length(seqs.back()), static_cast<int64_t>(p.size()));
  }
  std::vector<float> last = concat(r.prefill);
  for (int s = 0; s < steps; ++s) {
    r.fed.push_back(next_tokens(last, M, V, force, s));
    last.assign(static_cast<size_t>(M * V), 0.0f);
    r.rows.push_back(dec.decode(seqs.data(), r.fed.back().data(), M, last.data()));
    r.logits.push_back(last);
  }
  for (int64_t q : seqs) dec.close(q);
  return r;
}

}  // namespace jtok::cuda_test
