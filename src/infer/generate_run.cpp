#include "infer/generate_run.h"

#include <chrono>
#include <limits>
#include <random>

#include "infer/prefetch.h"

namespace jtok {

double top2_margin(const std::vector<float>& logits) {
  float a = -std::numeric_limits<float>::infinity(), b = a;
  for (float x : logits) {
    if (x > a) { b = a; a = x; }
    else if (x > b) b = x;
  }
  return static_cast<double>(a) - b;
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
bool is_stop(const std::vector<int32_t>& stop_ids, int32_t token) {
  for (int32_t s : stop_ids)
    if (s == token) return true;
  return false;
}
}  // namespace

GenerateResult generate_tokens(const Model& m, const std::vector<int32_t>& prompt, int64_t capacity,
                               const GenerateOptions& opt, const std::function<void(int32_t)>& on_token) {
  GenerateResult r;
  std::mt19937_64 rng(opt.seed);
  auto t0 = std::chrono::steady_clock::now();
  KVCache cache;
  cache.bf16 = opt.kv_bf16;
  prefetch_disk_rows(m, prompt.data(), static_cast<int64_t>(prompt.size()));  // disk tables: read from now on
  std::vector<float> logits = prefill(m, cache, prompt, capacity);
  r.prefill_s = seconds_since(t0);
  auto t1 = std::chrono::steady_clock::now();
  for (int64_t produced = 0; produced < opt.max_new_tokens;) {
    int32_t next = sample_token(logits, opt.sampling, rng);
    if (produced + 1 < opt.max_new_tokens) prefetch_disk_rows(m, &next, 1);  // read during the output and first layers
    r.top2_margins.push_back(top2_margin(logits));
    ++produced;
    r.generated.push_back(next);
    if (is_stop(opt.stop_ids, next)) break;
    on_token(next);
    if (cache.len >= cache.capacity) break;
    logits = decode_step(m, cache, next);
  }
  r.decode_s = seconds_since(t1);
  return r;
}

std::vector<float> prompt_logprobs(const Model& m, const std::vector<int32_t>& prompt) {
  const int64_t T = static_cast<int64_t>(prompt.size());
  Activations acts;
  forward(m, acts, prompt.data(), 1, T);
  std::vector<int32_t> targets(prompt.begin() + 1, prompt.end());
  targets.push_back(0);  // the last position's target is not reported
  std::vector<float> lp(static_cast<size_t>(T));
  token_logprobs(m, acts, targets.data(), lp.data());
  lp.pop_back();
  return lp;
}

}  // namespace jtok
