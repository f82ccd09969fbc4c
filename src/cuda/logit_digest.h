// A logit row's digest (issue 40: sampling on the GPU): what the host needs to pick a decode step's
// token and its log-probs without the row itself. One block a row on the device (logit_digest.cu);
// its CPU twin logit_digest_ref (logit_digest_ref.cpp, plain C++ in jtok_lib) computes the same
// struct with sample_token's and token_logprob's own arithmetic (infer/generate.cpp,
// infer/logprobs.cpp), so the CPU tests can assert bit equality; the host's pick from a digest is
// infer/token_pick.h. Plain header: includable from g++ code with or without the CUDA toolkit (the
// CPU build's token_pick reads these structs), so the stream is CUDA's own CUstream_st*, which is
// what cudaStream_t names.
#pragma once
#include <cstdint>

struct CUstream_st;

namespace jtok::cuda {

constexpr int kDigestTop = 64;  // the most likely ids a digest lists

// A row's inputs: temperature (<= 0: greedy, no draw; a double, SamplingParams' own, so that
// (l - max) / T has sample_token's bits) and u in [0, 1), one draw of the sequence's RNG made before
// the step (std::generate_canonical<double, 53>: what uniform_real_distribution scales), used only
// by plain temperature sampling.
struct DigestRow {
  double temperature = 0;
  double u = 0;
};

// One row of V logits l (NaN-free). Ties go to the lower id everywhere, as std::max_element and
// sample_token's comparator (a > b, or a == b and id lower) order them.
//   argmax, max: the first index of the largest logit, and it.
//   lse: log(sum_i exp(l_i - max)) + max, the sum in double (token_logprob's).
//   sum_t (temperature > 0, else 0): sum_i exp((l_i - max) / T) in double. The reference sums it in
//     sample_token's top-p order (sorted by the comparator, most likely first); the GPU by a fixed tree.
//   top_id / top_logit [0, n_top): the n_top = min(V, kDigestTop) most likely, sorted by the comparator.
//   drawn, drawn_logit (temperature > 0, else -1 / 0): plain temperature sampling's pick, the first
//     index i (index order) where the running sum of w_j = exp((l_j - max) / T) (double) reaches
//     r = u * S, S the index-order sum of the w_j (the reference: sample_token's subtraction
//     r -= w_i until r <= 0, over its own index-order sum; the GPU: its sum_t and a fixed tree).
struct LogitDigest {
  int32_t argmax = -1;
  float max = 0;
  double lse = 0;
  double sum_t = 0;
  int32_t drawn = -1;
  float drawn_logit = 0;
  int32_t n_top = 0;
  int32_t top_id[kDigestTop] = {};
  float top_logit[kDigestTop] = {};
};

// The reference (host, plain C++): the digest of logits (V) with row's inputs.
LogitDigest logit_digest_ref(const float* logits, int64_t V, const DigestRow& row);

// out (M) = the digests of logits' M rows of V values (row stride ld >= V), row i's inputs rows[i];
// logits, rows and out on the device. One block a row; queued on `stream`, no host sync (a CUDA
// graph may capture it). Deterministic: fixed reduction trees, integer counts only.
void logit_digest(LogitDigest* out, const float* logits, int64_t M, int64_t V, int64_t ld, const DigestRow* rows,
                  CUstream_st* stream);

}  // namespace jtok::cuda
