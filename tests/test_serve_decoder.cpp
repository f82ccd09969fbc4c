// The serving engine on a decoder shaped like the GPU's, in CI: no host caches, prefix blocks that
// share KV pages with the sequences (Decoder::blocks_shared) and bounds that are whole pages. The
// keys and values are the CPU decoder's (so the bits are the CPU's); every page is counted in a
// cuda::KvPages pool (the GPU decoder's own bookkeeping) sized from the engine's KV budget, so the
// engine's accounting of shared blocks is checked against the pages it really takes, and a write
// into a shared page fails the step.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>

#include "core/error.h"
#include "cuda/kv_pages.h"
#include "infer/decoder.h"
#include "serve/engine.h"
#include "serve_test_util.h"

using namespace jtok;
using namespace jtok::testing;

namespace {

// Handles are the pool's; each maps to the CPU decoder's sequence or block of the same contents.
class PagedOffHostDecoder final : public Decoder {
 public:
  PagedOffHostDecoder(const Model& m, bool kv_bf16, int64_t n_pages, int64_t page_tokens, int64_t max_seqs)
      : cpu_(make_cpu_decoder(m, kv_bf16)), pages_(n_pages, page_tokens, max_seqs), n_pages_(n_pages) {}
  std::string describe() const override { return "paged off-host test decoder"; }
  int64_t vocab_size() const override { return cpu_->vocab_size(); }
  int64_t open(int64_t capacity) override {
    std::lock_guard<std::mutex> lk(mu_);
    return opened(pages_.open(capacity), cpu_->open(capacity));
  }
  void close(int64_t seq) override {
    std::lock_guard<std::mutex> lk(mu_);
    pages_.close(seq);
    cpu_->close(seqs_.at(seq));
    seqs_.erase(seq);
  }
  int64_t fork(int64_t seq, int64_t capacity) override {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::pair<int32_t, int32_t>> copies;
    const int64_t p = pages_.fork(seq, capacity, copies);
    forks_++;
    for (int32_t page : pages_.pages(p)) shared_in_forks_ += pages_.refs(page) > 1;
    return opened(p, cpu_->fork(seqs_.at(seq), capacity));
  }
  int64_t length(int64_t seq) const override {
    std::lock_guard<std::mutex> lk(mu_);
    return cpu_->length(seqs_.at(seq));
  }
  int64_t capacity(int64_t seq) const override {
    std::lock_guard<std::mutex> lk(mu_);
    return cpu_->capacity(seqs_.at(seq));
  }
  std::vector<float> prefill(int64_t seq, const int32_t* tokens, int64_t n, const PositionLogits& each) override {
    std::lock_guard<std::mutex> lk(mu_);
    writes(seq, n);
    std::vector<float> l = cpu_->prefill(seqs_.at(seq), tokens, n, each);
    pages_.advance(seq, n);
    return l;
  }
  int64_t decode(const int64_t* seqs, const int32_t* tokens, int64_t M, float* logits) override {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<int64_t> cpu;
    for (int64_t i = 0; i < M; ++i) {
      writes(seqs[i], 1);
      cpu.push_back(seqs_.at(seqs[i]));
    }
    const int64_t rows = cpu_->decode(cpu.data(), tokens, M, logits);
    for (int64_t i = 0; i < M; ++i) pages_.advance(seqs[i], 1);
    return rows;
  }
  int64_t keep_block(int64_t seq, int64_t first, int64_t n) override {
    std::lock_guard<std::mutex> lk(mu_);
    const int64_t b = pages_.keep(seq, first, n);
    blocks_[b] = cpu_->keep_block(seqs_.at(seq), first, n);
    return b;
  }
  void drop_block(int64_t block) override {
    std::lock_guard<std::mutex> lk(mu_);
    // Another holder of its pages is a sequence mapping them, which the engine no longer counts.
    for (int32_t page : pages_.block_pages(block)) dropped_mapped_ += pages_.refs(page) > 1;
    pages_.drop(block);
    cpu_->drop_block(blocks_.at(block));
    blocks_.erase(block);
  }
  int64_t open_from_blocks(const std::vector<int64_t>& blocks, int64_t capacity) override {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<int64_t> cpu;
    for (int64_t b : blocks) cpu.push_back(blocks_.at(b));
    return opened(pages_.open_from(blocks, capacity), cpu_->open_from_blocks(cpu, capacity));
  }
  int64_t block_granule() const override { return pages_.page_tokens(); }
  bool blocks_shared() const override { return true; }

  int64_t used_pages() const {
    std::lock_guard<std::mutex> lk(mu_);
    return n_pages_ - pages_.free_pages();
  }
  int64_t peak_pages() const {
    std::lock_guard<std::mutex> lk(mu_);
    return peak_;
  }
  int64_t stored_blocks() const {
    std::lock_guard<std::mutex> lk(mu_);
    return pages_.blocks();
  }
  int64_t forks() const {
    std::lock_guard<std::mutex> lk(mu_);
    return forks_;
  }
  int64_t dropped_mapped() const {  // pages of dropped blocks a sequence still mapped: must stay 0
    std::lock_guard<std::mutex> lk(mu_);
    return dropped_mapped_;
  }
  int64_t shared_in_forks() const {  // pages forks mapped instead of copying
    std::lock_guard<std::mutex> lk(mu_);
    return shared_in_forks_;
  }

 private:
  int64_t opened(int64_t p, int64_t c) {
    seqs_[p] = c;
    peak_ = std::max(peak_, n_pages_ - pages_.free_pages());
    return p;
  }
  // Positions length..length+n-1 of seq land on pages it alone holds (the GPU would write them there).
  void writes(int64_t seq, int64_t n) const {
    const int64_t len = pages_.length(seq), pt = pages_.page_tokens();
    for (int64_t p = len; p < len + n && p < pages_.capacity(seq); ++p) {
      const int32_t page = pages_.pages(seq)[static_cast<size_t>(p / pt)];
      if (pages_.refs(page) != 1) fail("test decoder: position ", p, " of sequence ", seq, " is on shared page ", page);
    }
  }
  mutable std::mutex mu_;  // the test reads the counts while the scheduler runs
  std::unique_ptr<Decoder> cpu_;
  cuda::KvPages pages_;
  int64_t n_pages_, peak_ = 0, forks_ = 0, shared_in_forks_ = 0, dropped_mapped_ = 0;
  std::map<int64_t, int64_t> seqs_, blocks_;  // pool handle -> CPU handle
};

constexpr int64_t kPage = 2, kBlock = 4;

// Pages enough for the engine's budget and one partly used page per sequence: what the engine's
// accounting must stay within.
int64_t pool_pages(const EngineOptions& o) { return o.kv_budget_tokens / kPage + o.max_batch; }

std::vector<int32_t> shared_prefix() {
  std::vector<int32_t> p;
  for (int j = 0; j < 14; ++j) p.push_back(static_cast<int32_t>((j * 31 + 3) % 97));
  return p;
}

GenerationRequest request(const std::vector<int32_t>& tail, size_t keep, uint64_t seed) {
  const std::vector<int32_t> shared = shared_prefix();
  GenerationRequest r;
  r.prompt.assign(shared.begin(), shared.begin() + static_cast<std::ptrdiff_t>(keep));
  r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
  r.max_tokens = 8;
  r.sampling = {seed % 2 ? 0.9 : 0.0, 0, 1.0};
  r.seed = seed;
  r.top_logprobs = 3;
  return r;
}

void expect_alone(const Model& m, const GenerationRequest& r, const Sequence& s, bool bf16, const std::string& where) {
  EXPECT_EQ(s.finish_reason == "error" ? s.error : "", "") << where;
  const Alone want = alone(m, r, bf16, kBlock);
  EXPECT_EQ(s.tokens, want.tokens) << where;
  ASSERT_EQ(s.logprobs.size(), want.lps.size()) << where;
  for (size_t k = 0; k < want.lps.size(); ++k) expect_same(s.logprobs[k], want.lps[k], where);
}

}  // namespace

// The CPU engine's prefix test on the paged decoder: reused blocks give a cold prefill's bits,
// tokens and log-probs, n choices (forks of a sequence that maps shared pages) included; the pages
// in use once every request has ended are the stored blocks', each counted once.
TEST(ServeDecoder, SharedBlocksGiveTheBitsOfAColdPrefill) {
  for (const bool bf16 : {false, true}) {
    const std::string where = bf16 ? "bf16" : "f32";
    Model m = make_model(tiny_serve_config(), 5);
    EngineOptions o;
    o.prefix_cache = true;
    o.prefix_block = kBlock;
    o.prefill_chunk = 8;
    o.kv_bf16 = bf16;
    o = resolve_engine_options(m, o);
    auto dec = std::make_unique<PagedOffHostDecoder>(m, bf16, pool_pages(o), kPage, o.max_batch);
    PagedOffHostDecoder& d = *dec;
    Engine e(m, o, std::move(dec));
    const std::vector<GenerationRequest> reqs = {request({60, 61, 62}, 14, 1), request({70, 71, 72, 73, 74}, 14, 2),
                                                 request({80, 81}, 9, 3), request({60, 61, 62}, 14, 4)};
    const int64_t cached[] = {0, 12, 8, 16};
    std::vector<std::shared_ptr<Sequence>> seqs{e.submit(reqs[0])};
    ASSERT_TRUE(seqs[0]);
    wait_done(*seqs[0]);
    for (size_t i = 1; i < reqs.size(); ++i) seqs.push_back(e.submit(reqs[i]));
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(seqs[i]);
      wait_done(*seqs[i]);
      expect_alone(m, reqs[i], *seqs[i], bf16, where + " request " + std::to_string(i));
      EXPECT_EQ(seqs[i]->cached_tokens, cached[i]) << where << " request " << i;
    }
    GenerationRequest nr = reqs[1];  // 3 choices from the 4 blocks request 1 stored
    nr.n = 3;
    nr.seed = 41;
    const auto choices = e.submit_choices(nr);
    ASSERT_EQ(choices.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      wait_done(*choices[i]);
      GenerationRequest one = nr;
      one.n = 1;
      one.seed = nr.seed + i;
      expect_alone(m, one, *choices[i], bf16, where + " choice " + std::to_string(i));
      EXPECT_EQ(choices[i]->cached_tokens, 16) << where << " choice " << i;
    }
    const EngineStats st = settled(e, 4 + 3);
    EXPECT_EQ(st.kv_tokens_used, 0) << where;  // every reservation given back, the shared parts too
    EXPECT_EQ(st.prefix_tokens_reused, 12 + 8 + 16 + 16) << where;
    EXPECT_EQ(st.prefix_blocks_held, 0) << where;
    EXPECT_EQ(d.forks(), 2) << where;
    EXPECT_EQ(d.shared_in_forks(), 2 * 4 * kBlock / kPage) << where;  // each fork mapped the 4 blocks' pages
    EXPECT_EQ(d.stored_blocks(), st.prefix_blocks_cached) << where;
    EXPECT_EQ(d.dropped_mapped(), 0) << where;
    EXPECT_EQ(d.used_pages(), st.prefix_blocks_cached * kBlock / kPage) << where;  // no sequence is open
  }
}

// A budget of two contexts and three requests at a time, n choices among them (ending at different
// steps): blocks are stored, shared, evicted and stored again under pressure; none is dropped while
// a sequence (a fork whose first choice has ended included) maps it. Whatever is reused, every request gets its cold
// bits, nothing fails for want of a page, the pool never holds more than the budget allows (plus a
// partly used page a sequence) and the reservations return to zero.
TEST(ServeDecoder, TheBudgetCountsSharedBlocksOnce) {
  Model m = make_model(tiny_serve_config(), 5);
  EngineOptions o;
  o.prefix_cache = true;
  o.prefix_block = kBlock;
  o.prefill_chunk = 8;
  o.max_batch = 4;
  o.kv_budget_tokens = 2 * 48;
  o = resolve_engine_options(m, o);
  auto dec = std::make_unique<PagedOffHostDecoder>(m, false, pool_pages(o), kPage, o.max_batch);
  PagedOffHostDecoder& d = *dec;
  Engine e(m, o, std::move(dec));
  std::vector<GenerationRequest> reqs;
  for (int round = 0; round < 3; ++round) {
    reqs.push_back(request({60, 61, 62}, 14, 10 + round));
    reqs.push_back(request({static_cast<int32_t>(70 + round), 71}, 9, 20 + round));
    GenerationRequest two = request({80, 81, 82, 83}, 12, 31 + 2 * round);
    two.n = 3;
    two.max_tokens = 16;
    for (int32_t t = 0; t < 97; t += 5) two.stop_tokens.push_back(t);  // its choices end at different steps
    reqs.push_back(two);
  }
  std::vector<std::vector<std::shared_ptr<Sequence>>> got;
  for (const auto& r : reqs) got.push_back(e.submit_choices(r));
  int64_t choices = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(got[i].size(), static_cast<size_t>(reqs[i].n)) << "request " << i;
    for (size_t c = 0; c < got[i].size(); ++c) {
      wait_done(*got[i][c]);
      GenerationRequest one = reqs[i];
      one.n = 1;
      one.seed = reqs[i].seed + c;
      expect_alone(m, one, *got[i][c], false, "request " + std::to_string(i) + " choice " + std::to_string(c));
      ++choices;
    }
  }
  const EngineStats st = settled(e, choices);
  EXPECT_EQ(st.kv_tokens_used, 0);
  EXPECT_GT(st.prefix_tokens_reused, 0);
  EXPECT_LE(st.prefix_blocks_cached * kBlock, o.kv_budget_tokens);
  EXPECT_LE(d.peak_pages(), pool_pages(o));
  EXPECT_EQ(d.dropped_mapped(), 0);
  EXPECT_EQ(d.used_pages(), st.prefix_blocks_cached * kBlock / kPage);
}

// The engine refuses a block that is no whole number of the decoder's pages, naming both.
TEST(ServeDecoder, RefusesABlockThatIsNoWholePages) {
  Model m = make_model(tiny_serve_config(), 5);
  EngineOptions o;
  o.prefix_cache = true;
  o.prefix_block = 3;
  o.prefill_chunk = 8;
  try {
    Engine e(m, o, std::make_unique<PagedOffHostDecoder>(m, false, 64, kPage, 4));
    FAIL() << "accepted a block of 3 on pages of 2";
  } catch (const Error& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("prefix block (3 tokens)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("multiple of the decoder's 2"), std::string::npos) << msg;
  }
}
