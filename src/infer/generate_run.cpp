#include "infer/generate_run.h"

#include <chrono>
#include <limits>
#include <random>

#include "core/error.h"
#include "infer/logprobs.h"
#include "infer/prefetch.h"

namespace jtok {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
bool is_stop(const std::vector<int32_t>& stop_ids, int32_t token) {
  for (int32_t s : stop_ids)
    if (s == token) return true;
  return false;
}

// Prompt log-probs into lp (P - 1 values): position q's logits give token q + 1's.
PositionLogits prompt_logprob_sink(std::vector<float>& lp, const std::vector<int32_t>& prompt, int64_t V) {
  lp.assign(prompt.size() - 1, 0.0f);
  return [&lp, &prompt, V](int64_t pos, int64_t n, const float* logits) {
    for (int64_t r = 0; r < n && pos + r + 1 < static_cast<int64_t>(prompt.size()); ++r)
      lp[static_cast<size_t>(pos + r)] = token_logprob(logits + r * V, V, prompt[static_cast<size_t>(pos + r + 1)], 0).logprob;
  };
}
}  // namespace

GenerateResult generate_tokens(const Model& m, Decoder& d, const std::vector<int32_t>& prompt, int64_t capacity,
                               const GenerateOptions& opt, const std::function<void(int32_t)>& on_token) {
  GenerateResult r;
  std::mt19937_64 rng(opt.seed);
  auto t0 = std::chrono::steady_clock::now();
  if (prompt.empty()) fail("empty prompt: give at least one token");
  prefetch_disk_rows(m, prompt.data(), static_cast<int64_t>(prompt.size()));  // disk tables: read from now on
  const int64_t seq = d.open(capacity);
  struct Closer {  // the sequence closed however this returns (a device decoder's pages back to its pool)
    Decoder& d;
    int64_t seq;
    ~Closer() {
      try {
        d.close(seq);
      } catch (...) {  // a destructor must not throw; the decoder's own error already went up, if any
      }
    }
  } closer{d, seq};
  PositionLogits each;
  if (opt.prompt_logprobs) each = prompt_logprob_sink(r.prompt_logprobs, prompt, m.cfg.vocab_size);
  const std::vector<float> logits = d.prefill(seq, prompt.data(), static_cast<int64_t>(prompt.size()), each);
  r.prefill_s = seconds_since(t0);
  auto t1 = std::chrono::steady_clock::now();
  // Each step's token picked where its logits are (Decoder::decode_pick: on a GPU, from their digest).
  const PickRequest req{.sampling = opt.sampling, .rng = &rng, .top_logprobs = -1, .want_margin = true};
  TokenPick pick = pick_from_row(logits.data(), m.cfg.vocab_size, req);
  for (int64_t produced = 0; produced < opt.max_new_tokens;) {
    int32_t next = pick.token;
    if (produced + 1 < opt.max_new_tokens) prefetch_disk_rows(m, &next, 1);  // read during the output and first layers
    r.top2_margins.push_back(pick.margin);
    ++produced;
    r.generated.push_back(next);
    if (is_stop(opt.stop_ids, next)) break;
    on_token(next);
    if (produced >= opt.max_new_tokens || d.length(seq) >= d.capacity(seq)) break;  // no step whose pick goes unused
    d.decode_pick(&seq, &next, 1, &req, &pick);
  }
  r.decode_s = seconds_since(t1);
  return r;
}

GenerateResult generate_tokens(const Model& m, const std::vector<int32_t>& prompt, int64_t capacity,
                               const GenerateOptions& opt, const std::function<void(int32_t)>& on_token) {
  const std::unique_ptr<Decoder> d = make_cpu_decoder(m, opt.kv_bf16);
  return generate_tokens(m, *d, prompt, capacity, opt, on_token);
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
