// One prompt decoded token by token from a KV cache (`jtok generate`), on a Decoder (the CPU or the
// GPU): prefill, then sample, hand each token to the caller as it comes, decode the next; the disk
// tables' rows read ahead by id.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "infer/decoder.h"
#include "infer/generate.h"
#include "model/transformer.h"

namespace jtok {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  SamplingParams sampling;
  uint64_t seed = 1;
  bool kv_bf16 = false;           // the Model overload's CPU decoder: KVCache::bf16
  bool prompt_logprobs = false;   // GenerateResult::prompt_logprobs, from the prefill's logits of every position
  std::vector<int32_t> stop_ids;  // generation ends at one of these (kept in `generated`, not handed over); empty: none
};

struct GenerateResult {
  std::vector<int32_t> generated;     // every sampled token, a final stop token included
  std::vector<double> top2_margins;   // per sampled token: how close greedy decoding was to a tie
  std::vector<float> prompt_logprobs; // log p(prompt[t] | prompt[<t]), t >= 1 (with opt.prompt_logprobs)
  double prefill_s = 0, decode_s = 0;  // wall-clock seconds of the prefill and of the decode loop
};

// Prefills prompt into a cache of `capacity` positions, then samples up to max_new_tokens tokens;
// on_token gets each one that is not a stop token, in order, before the next is decoded. Stops at a
// stop token or when the cache is full.
// The sequence lives on d (opened here, closed at the end); m is d's model (its disk tables read ahead).
GenerateResult generate_tokens(const Model& m, Decoder& d, const std::vector<int32_t>& prompt, int64_t capacity,
                               const GenerateOptions& opt, const std::function<void(int32_t)>& on_token);
// The same on make_cpu_decoder(m, opt.kv_bf16): prefill and decode_step's bits.
GenerateResult generate_tokens(const Model& m, const std::vector<int32_t>& prompt, int64_t capacity,
                               const GenerateOptions& opt, const std::function<void(int32_t)>& on_token);

// log p(prompt[t] | prompt[<t]) for t >= 1 (prompt.size() - 1 values), from one full forward over the prompt.
std::vector<float> prompt_logprobs(const Model& m, const std::vector<int32_t>& prompt);

}  // namespace jtok
