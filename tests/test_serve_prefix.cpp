// Prefix reuse in the serving engine: the block store matches whole chains only, evicts least
// recently used blocks nobody holds, and the CPU decoder's blocks come back bit for bit; requests that reuse stored
// blocks give the tokens and log-probs of a cold prefill in the same pieces (prefill_chunked), bit
// for bit, for dense, JTok and JTok-M models with f32 and bf16 caches, n choices included; prompts
// asking for their own log-probs reuse nothing; a small KV budget evicts blocks to admit requests.
// With disk tables a prompt reusing stored blocks reads ahead, and reads, only its prefilled tokens' rows.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "store/table_store.h"
#include "train/store_export.h"
#include "serve/engine.h"
#include "serve/prefix_cache.h"
#include "serve_test_util.h"

using namespace jtok;
using namespace jtok::testing;

namespace {

// A CPU decoder sequence of tiny_serve_config's model holding prompt (room for capacity positions).
int64_t prefilled_seq(Decoder& d, const std::vector<int32_t>& prompt, int64_t capacity) {
  const int64_t s = d.open(capacity);
  d.prefill(s, prompt.data(), static_cast<int64_t>(prompt.size()));
  return s;
}

// Stores every whole block of tokens (block 2) from decoder sequence seq; returns the chain (held: release it).
std::vector<int64_t> store_all(PrefixCache& pc, const std::vector<int32_t>& tokens, int64_t seq, int64_t max_blocks) {
  std::vector<int64_t> ids;
  for (int64_t j = 0; (j + 1) * 2 <= static_cast<int64_t>(tokens.size()); ++j) {
    const int64_t id = pc.store_acquire(ids.empty() ? -1 : ids.back(), tokens.data() + 2 * j, seq, j, max_blocks);
    if (id < 0) break;
    ids.push_back(id);
  }
  return ids;
}

ModelConfig variant(const std::string& kind) {
  ModelConfig c = tiny_serve_config();
  c.jtok = kind == "jtok";
  c.jtokm = kind == "jtokm";
  return c;
}

}  // namespace

TEST(PrefixCache, MatchesWholeChainsAndLoadsTheirBits) {
  const Model m = make_model(tiny_serve_config(), 5);
  const int64_t kvd = m.cfg.kv_dim();
  for (bool bf16 : {false, true}) {
    std::unique_ptr<Decoder> d = make_cpu_decoder(m, bf16);
    PrefixCache pc(2, *d);
    const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7};
    const int64_t sa = prefilled_seq(*d, a, 8);
    std::vector<int64_t> held = store_all(pc, a, sa, 100);
    ASSERT_EQ(held.size(), 3u);  // the 7th token is no whole block
    pc.release(held);
    // b shares the first block only; c's second block equals a's but follows another first block.
    const std::vector<int32_t> b = {1, 2, 3, 9, 5, 6}, c = {8, 2, 3, 4};
    EXPECT_EQ(pc.match_acquire(b.data(), 6).size(), 1u);
    EXPECT_EQ(pc.match_acquire(c.data(), 4).size(), 0u);
    std::vector<int64_t> mt = pc.match_acquire(a.data(), 5);  // limit 5: two whole blocks
    ASSERT_EQ(mt.size(), 2u);
    const int64_t sg = pc.open(mt, 10);
    const KVCache& ca = *d->host_cache(sa);
    const KVCache& got = *d->host_cache(sg);
    EXPECT_EQ(got.len, 4);
    EXPECT_EQ(got.capacity, 10);
    EXPECT_EQ(got.bf16, bf16);
    for (size_t l = 0; l < ca.layers(); ++l) {
      if (bf16) {
        EXPECT_TRUE(std::equal(ca.k16[l].begin(), ca.k16[l].begin() + 4 * kvd, got.k16[l].begin())) << l;
        EXPECT_TRUE(std::equal(ca.v16[l].begin(), ca.v16[l].begin() + 4 * kvd, got.v16[l].begin())) << l;
      } else {
        EXPECT_TRUE(std::equal(ca.k[l].begin(), ca.k[l].begin() + 4 * kvd, got.k[l].begin())) << l;
        EXPECT_TRUE(std::equal(ca.v[l].begin(), ca.v[l].begin() + 4 * kvd, got.v[l].begin())) << l;
      }
    }
    const PrefixCacheStats s = pc.stats();
    EXPECT_EQ(s.tokens_reused, 2 + 4);
    EXPECT_EQ(s.hits, 2);
    EXPECT_EQ(s.blocks, 3);
    EXPECT_EQ(s.held, 2);  // b's block 0 (a's too) and mt's block 1
  }
}

TEST(PrefixCache, EvictsLeastRecentlyUsedUnheldLeavesFirst) {
  const Model m = make_model(tiny_serve_config(), 5);
  std::unique_ptr<Decoder> d = make_cpu_decoder(m, false);
  PrefixCache pc(2, *d);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6}, b = {7, 8, 9, 10};
  const int64_t seq = prefilled_seq(*d, a, 6);  // the blocks' bits do not matter here
  pc.release(store_all(pc, a, seq, 100));     // a0 <- a1 <- a2
  pc.release(store_all(pc, b, seq, 100));     // b0 <- b1, stored after a
  pc.release(pc.match_acquire(a.data(), 6));  // a used again: b is now the least recently used
  EXPECT_EQ(pc.evict_to(3), 3);               // b1, then b0 (a leaf once b1 is gone)
  EXPECT_EQ(pc.match_acquire(b.data(), 4).size(), 0u);
  const std::vector<int64_t> ha = pc.match_acquire(a.data(), 6);
  EXPECT_EQ(ha.size(), 3u);
  EXPECT_EQ(pc.evict_to(0), 3);  // all held: none evicted
  EXPECT_EQ(pc.store_acquire(-1, b.data(), seq, 0, 3), -1);  // no room, nothing evictable
  EXPECT_EQ(pc.stats().held, 3);
  pc.release(ha);
  EXPECT_EQ(pc.evict_to(0), 0);
  const PrefixCacheStats s = pc.stats();
  EXPECT_EQ(s.evicted, 5);
  EXPECT_EQ(s.stored, 5);
  EXPECT_THROW(pc.release(ha), Error);  // released twice
}

// Requests that begin with stored blocks (whole chains: 3 blocks, 2 blocks, every block before the
// last token) give what a cold prefill in blocks gives alone, tokens and log-probs bit for bit; so do
// n choices from reused blocks, each with its derived seed.
TEST(ServePrefix, ReusedBlocksGiveTheBitsOfAColdPrefill) {
  for (const std::string kind : {"dense", "jtok", "jtokm"})
    for (bool bf16 : {false, true}) {
      const std::string where = kind + (bf16 ? " bf16" : " f32");
      Model m = make_model(variant(kind), 5);
      EngineOptions o;
      o.prefix_cache = true;
      o.prefix_block = 4;
      o.prefill_chunk = 8;  // two blocks a step: longer prompts take several steps
      o.kv_bf16 = bf16;
      Engine e(m, o);
      std::vector<int32_t> shared;
      for (int j = 0; j < 14; ++j) shared.push_back(static_cast<int32_t>((j * 31 + 3) % 97));
      auto request = [&](std::vector<int32_t> tail, size_t keep, uint64_t seed) {
        GenerationRequest r;
        r.prompt.assign(shared.begin(), shared.begin() + static_cast<std::ptrdiff_t>(keep));
        r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
        r.max_tokens = 8;
        r.sampling = {seed % 2 ? 0.9 : 0.0, 0, 1.0};
        r.seed = seed;
        r.top_logprobs = 3;
        return r;
      };
      const std::vector<GenerationRequest> reqs = {request({60, 61, 62}, 14, 1),  // cold: stores 4 blocks
                                                   request({70, 71, 72, 73, 74}, 14, 2),  // reuses 3 blocks
                                                   request({80, 81}, 9, 3),               // reuses 2 blocks
                                                   request({60, 61, 62}, 14, 4)};         // all but the last token
      const int64_t cached[] = {0, 12, 8, 16};
      std::vector<std::shared_ptr<Sequence>> seqs{e.submit(reqs[0])};
      ASSERT_TRUE(seqs[0]);
      wait_done(*seqs[0]);
      for (size_t i = 1; i < reqs.size(); ++i) seqs.push_back(e.submit(reqs[i]));
      for (size_t i = 0; i < reqs.size(); ++i) {
        ASSERT_TRUE(seqs[i]);
        wait_done(*seqs[i]);
        const Alone want = alone(m, reqs[i], bf16, 4);
        EXPECT_EQ(seqs[i]->tokens, want.tokens) << where << " request " << i;
        ASSERT_EQ(seqs[i]->logprobs.size(), want.lps.size()) << where << " request " << i;
        for (size_t k = 0; k < want.lps.size(); ++k)
          expect_same(seqs[i]->logprobs[k], want.lps[k], where + " request " + std::to_string(i));
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
        EXPECT_EQ(choices[i]->tokens, alone(m, one, bf16, 4).tokens) << where << " choice " << i;
        EXPECT_EQ(choices[i]->cached_tokens, 16) << where << " choice " << i;
      }
      const EngineStats st = settled(e, 4 + 3);
      EXPECT_EQ(st.prefix_tokens_reused, 12 + 8 + 16 + 16) << where;
      EXPECT_EQ(st.prefix_hits, 4) << where;
      EXPECT_EQ(st.prefix_blocks_held, 0) << where;  // every sequence has ended
      EXPECT_GT(st.prefix_blocks_cached, 0) << where;
    }
}

// echo with logprobs needs every prompt position's logits: such a prompt reuses nothing (its
// log-probs are a cold engine's, bit for bit) but stores its blocks for others.
TEST(ServePrefix, PromptLogprobsReuseNothing) {
  Model m = make_model(tiny_serve_config(), 5);
  EngineOptions o;
  o.prefix_cache = true;
  o.prefix_block = 4;
  GenerationRequest r;
  for (int j = 0; j < 19; ++j) r.prompt.push_back(static_cast<int32_t>((j * 11 + 2) % 97));
  r.max_tokens = 0;
  r.top_logprobs = 2;
  r.prompt_logprobs = true;
  Engine warm(m, o), cold(m, o);
  auto w1 = warm.submit(r);
  wait_done(*w1);
  auto w2 = warm.submit(r), c = cold.submit(r);
  wait_done(*w2);
  wait_done(*c);
  EXPECT_EQ(w2->cached_tokens, 0);
  ASSERT_EQ(w2->prompt_logprobs.size(), 18u);
  ASSERT_EQ(c->prompt_logprobs.size(), 18u);
  for (size_t k = 0; k < 18; ++k) expect_same(w2->prompt_logprobs[k], c->prompt_logprobs[k], "position " + std::to_string(k));
  const EngineStats s = settled(warm, 2);
  EXPECT_EQ(s.prefix_tokens_reused, 0);
  EXPECT_EQ(s.prefix_blocks_stored, 4);  // the first request's; the second found them stored
}

// A budget of one context: a request that needs the room evicts the stored blocks nobody holds
// (least recently used first); the evicted prefix is prefilled again, with the same bits.
TEST(ServePrefix, TheKvBudgetEvictsStoredBlocksToAdmit) {
  Model m = make_model(tiny_serve_config(), 5);
  EngineOptions o;
  o.prefix_cache = true;
  o.prefix_block = 4;
  o.kv_budget_tokens = 48;  // the context
  Engine e(m, o);
  GenerationRequest a, f;
  for (int j = 0; j < 17; ++j) a.prompt.push_back(static_cast<int32_t>((j * 7 + 1) % 97));
  a.max_tokens = 3;  // needs 20 slots: 4 blocks stored beside it
  a.sampling = {0.0, 0, 1.0};
  for (int j = 0; j < 30; ++j) f.prompt.push_back(static_cast<int32_t>((j * 13 + 50) % 97));
  f.max_tokens = 10;  // needs 40: room for 2 blocks
  f.sampling = {0.0, 0, 1.0};
  auto s1 = e.submit(a);
  wait_done(*s1);
  EXPECT_EQ(settled(e, 1).prefix_blocks_cached, 4);
  auto s2 = e.submit(f);
  wait_done(*s2);
  EXPECT_EQ(s2->tokens, alone(m, f, false, 4).tokens);
  EngineStats st = settled(e, 2);
  EXPECT_EQ(st.prefix_blocks_evicted, 4);  // 2 to admit f, 2 more while f stored its first 2
  EXPECT_EQ(st.prefix_blocks_cached, 2);
  auto s3 = e.submit(a);
  wait_done(*s3);
  EXPECT_EQ(s3->cached_tokens, 0);  // a's blocks are gone
  EXPECT_EQ(s3->tokens, s1->tokens);
  EXPECT_EQ(s3->tokens, alone(m, a, false, 4).tokens);
  st = settled(e, 3);
  EXPECT_LE(st.prefix_blocks_cached * 4 + st.kv_tokens_used, 48);
}

// Disk tables: the second prompt reuses 3 stored blocks (12 tokens) and prefills 4. A reused
// position's rows are never gathered (its keys and values are the block's), so admission reads
// ahead only the 4 prefilled tokens' blocks, and those are the only blocks the store reads.
TEST(ServePrefix, DiskTablesReadAheadOnlyThePrefilledTokens) {
  Model m = make_model(tiny_serve_config(), 5);
  const std::string dir = ::testing::TempDir() + "serve_prefix_store_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  write_table_store(dir, m.tables, m.table_names);
  auto fresh_store = [&] {  // m's tables read from the store through a cold cache
    auto s = TableStore::open(dir, 1 << 20, 2);
    for (size_t k = 0; k < m.tables.size(); ++k) m.tables[k] = TokenTable::on_disk(disk_rows(s, static_cast<int64_t>(k)));
    return s;
  };
  auto store = fresh_store();
  EngineOptions o;
  o.prefix_cache = true;
  o.prefix_block = 4;
  o.prefill_chunk = 8;
  Engine e(m, o);
  GenerationRequest a, b;
  for (int32_t j = 0; j < 12; ++j) a.prompt.push_back(10 + j);
  b.prompt = a.prompt;
  for (int32_t j = 0; j < 4; ++j) a.prompt.push_back(30 + j), b.prompt.push_back(40 + j);
  a.max_tokens = b.max_tokens = 1;  // no sampled token is read ahead
  auto sa = e.submit(a);
  wait_done(*sa);
  EXPECT_EQ(settled(e, 1).prefix_blocks_cached, 4);
  EXPECT_EQ(store->stats().prefetch_queued, 16);  // a reused nothing: all its tokens read ahead
  store = fresh_store();  // the engine is idle: b's reads start from a cold cache
  auto sb = e.submit(b);
  wait_done(*sb);
  settled(e, 2);
  store->drain_prefetch();
  EXPECT_EQ(sb->cached_tokens, 12);
  const TableStore::Stats st = store->stats();
  EXPECT_EQ(st.prefetch_queued, 4);  // 40..43, not the reused 10..21
  EXPECT_EQ(st.reads, 4) << "a reused position's rows were read";
  EXPECT_EQ(st.misses + st.prefetch_reads, st.reads);
  std::filesystem::remove_all(dir);
}

TEST(ServePrefix, RefusesABlockLongerThanThePrefillChunk) {
  Model m = make_model(tiny_serve_config(), 5);
  EngineOptions o;
  o.prefix_cache = true;
  o.prefix_block = 16;
  o.prefill_chunk = 8;
  try {
    Engine e(m, o);
    FAIL() << "accepted a block of 16 with a prefill chunk of 8";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("--prefix-block"), std::string::npos) << err.what();
  }
}
