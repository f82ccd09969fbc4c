// The serving engine: requests batched together give the tokens each gives alone (greedy and
// seeded sampling), the KV budget and the queue bound hold, bad requests are refused with a
// message, and a cancelled sequence is freed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "serve/chat_template.h"
#include "serve/completion_request.h"
#include "serve/engine.h"
#include "serve_test_util.h"

using namespace jtok;
using namespace jtok::testing;

// --kv-dtype bf16: batched requests give what each gives alone with a bf16 cache (that a bf16 cache
// is really bf16 and how far it moves the logits: test_generate's Bf16KVCacheStaysCloseToF32).
TEST(ServeEngine, Bf16KVCachesGiveWhatEachGivesAloneWithOne) {
  Model m = make_model(tiny_serve_config(), 4);
  EngineOptions o;
  o.kv_bf16 = true;
  Engine e(m, o);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r;
    for (int j = 0; j < 3 + i; ++j) r.prompt.push_back(static_cast<int32_t>((i * 13 + j * 7 + 1) % 97));
    r.max_tokens = 12;
    r.sampling = {i % 2 ? 0.9 : 0.0, 0, 1.0};
    r.seed = 100 + i;
    reqs.push_back(r);
  }
  std::vector<std::shared_ptr<Sequence>> seqs;
  for (auto& r : reqs) seqs.push_back(e.submit(r));
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(seqs[i]);
    wait_done(*seqs[i]);
    EXPECT_EQ(seqs[i]->tokens, alone(m, reqs[i], true).tokens) << "request " << i;
  }
}

TEST(ServeEngine, BatchedRequestsGiveTheTokensEachGivesAlone) {
  Model m = make_model(tiny_serve_config(), 4);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 10; ++i) {
    GenerationRequest r;
    for (int j = 0; j <= i % 4; ++j) r.prompt.push_back(static_cast<int32_t>((i * 13 + j * 7) % 97));
    r.max_tokens = 6 + i;
    if (i % 2) r.sampling = {0.9, 20, 0.9};  // seeded sampling: the same stream of draws as alone
    else r.sampling = {0.0, 0, 1.0};
    r.seed = 100 + static_cast<uint64_t>(i);
    if (i == 3) r.stop_tokens = {5};
    reqs.push_back(r);
  }
  EngineOptions o;
  o.max_batch = 4;  // fewer slots than requests: some wait, and join between steps
  Engine e(m, o);
  std::vector<std::shared_ptr<Sequence>> seqs;
  for (auto& r : reqs) seqs.push_back(e.submit(r));
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(seqs[i]);
    wait_done(*seqs[i]);
    EXPECT_EQ(seqs[i]->tokens, alone(m, reqs[i]).tokens) << "request " << i;
    const bool full = static_cast<int64_t>(seqs[i]->tokens.size()) == reqs[i].max_tokens;
    EXPECT_EQ(seqs[i]->finish_reason, full ? "length" : "stop") << "request " << i;
  }
  // A sequence is marked done (waking its client) before the engine thread books the step's
  // statistics; give it a moment (it was seen lagging on a loaded machine).
  EngineStats s = e.stats();
  for (int i = 0; i < 1000 && (s.requests_finished < 10 || s.kv_tokens_used != 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s = e.stats();
  }
  EXPECT_EQ(s.requests_finished, 10);
  EXPECT_EQ(s.kv_tokens_used, 0);
  EXPECT_GT(s.decode_batch_sum, s.decode_steps);  // steps really ran several sequences
  EXPECT_LE(s.decode_batch_sum, 4 * s.decode_steps);
  EXPECT_GT(s.table_rows_read, 0);
}

TEST(ServeEngine, RefusesBadRequestsAndBoundsTheQueue) {
  Model m = make_model(tiny_serve_config(), 4);
  EngineOptions o;
  o.max_batch = 1;
  o.max_queue = 2;
  o.ctx = 32;
  Engine e(m, o);
  auto req = [](std::vector<int32_t> p, int64_t n) {
    GenerationRequest r;
    r.prompt = std::move(p);
    r.max_tokens = n;
    return r;
  };
  EXPECT_THROW(e.submit(req({}, 4)), Error);
  EXPECT_THROW(e.submit(req({1, 200}, 4)), Error);
  EXPECT_THROW(e.submit(req({1}, -1)), Error);
  EXPECT_THROW(e.submit(req(std::vector<int32_t>(30, 1), 3)), Error);  // 30 + 3 > 32
  EXPECT_THROW(e.submit(req({1}, INT64_MAX)), Error);  // P + max_tokens overflowed before (UBSan)
  // One long request runs; two wait; the next is refused. Holding the long one's lock stops the
  // scheduler at its first token (it publishes under that lock), so nothing finishes meanwhile.
  e.pause(true);
  auto first = e.submit(req({1}, 31));
  ASSERT_TRUE(first);
  std::unique_lock<std::mutex> hold(first->mu);
  e.pause(false);
  while (e.stats().requests_admitted == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto w1 = e.submit(req({2}, 4)), w2 = e.submit(req({3}, 4));
  ASSERT_TRUE(w1 && w2);
  EXPECT_FALSE(e.submit(req({4}, 4)));
  EXPECT_EQ(e.stats().requests_refused, 1);
  EXPECT_EQ(e.stats().queue_depth, 2);
  // Cancelling the long one frees its slot before its next step: the waiting ones finish.
  first->cancel = true;
  hold.unlock();
  wait_done(*first);
  wait_done(*w1);
  wait_done(*w2);
  EXPECT_EQ(first->finish_reason, "cancelled");
  EXPECT_LT(first->tokens.size(), 31u);
  EXPECT_EQ(w1->tokens.size(), 4u);
  EXPECT_TRUE(e.submit(req({4}, 4)));
  EngineStats s = e.stats();
  EXPECT_EQ(s.requests_cancelled, 1);
}

// The /v1/completions body parser (serve/completion_request.h; fuzzed by fuzz_completion_request):
// the regressions it had, each a 4xx now.
TEST(CompletionRequest, ParsesOrAnswers4xx) {
  const CompletionLimits lim{"jtok", 100, 0};
  auto encode = [](const std::string& t) {
    std::vector<int32_t> ids;
    for (unsigned char c : t) ids.push_back(c % 100);
    return ids;
  };
  auto error_of = [&](const std::string& body) {
    auto r = parse_completion_request(body, lim, encode);
    const ApiError* e = std::get_if<ApiError>(&r);
    return e ? std::to_string(e->status) + " " + e->param : std::string("ok");
  };
  auto r = parse_completion_request(R"({"prompt": "ab", "max_tokens": 16.0, "top_k": -1, "stop": ["x"]})", lim, encode);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r));
  const auto& q = std::get<CompletionRequest>(r);
  EXPECT_EQ(q.prompt, (std::vector<int32_t>{97, 98}));
  EXPECT_EQ(q.max_tokens, 16);
  EXPECT_EQ(q.sampling.top_k, 0);
  EXPECT_EQ(error_of("{"), "400 ");
  EXPECT_EQ(error_of(R"({"prompt": "a", "model": "gpt"})"), "404 model");
  // A float max_tokens outside int64: its conversion was undefined behaviour.
  EXPECT_EQ(error_of(R"({"prompt": "a", "max_tokens": 1e300})"), "400 max_tokens");
  EXPECT_EQ(error_of(R"({"prompt": "a", "seed": -1e19})"), "400 seed");
  // include_usage of the wrong type threw json::type_error: a 500 before.
  EXPECT_EQ(error_of(R"({"prompt": "a", "stream_options": {"include_usage": 1}})"), "400 include_usage");
  EXPECT_EQ(error_of(R"({"prompt": "a", "stream_options": 3})"), "400 stream_options");
  // Numbers above int64: named as they were sent (a token id 2^64 - 1 was reported as -1).
  EXPECT_EQ(error_of(R"({"prompt": [18446744073709551615]})"), "400 prompt");
  EXPECT_EQ(error_of(R"({"prompt": [5], "max_tokens": 18446744073709551615})"), "400 max_tokens");
}

// /v1/chat/completions' chat_template_kwargs reach the renderer (vLLM's and SGLang's field): Qwen3's
// enable_thinking false renders the empty think block; a variable no template reads is ignored, as
// Jinja ignores it; absent or null is the defaults; a non-object, or enable_thinking of another
// type, is a 400 naming chat_template_kwargs (the template is never rendered).
TEST(ChatRequest, ChatTemplateKwargsReachTheTemplate) {
  const CompletionLimits lim{"jtok", 100000, 0};
  const ChatTemplate qwen3{ChatFamily::qwen3, ""};
  std::string rendered;
  int renders = 0;
  auto render = [&](const nlohmann::json& messages, const ChatTemplateArgs& args) {
    ++renders;
    rendered = render_chat(qwen3, parse_chat_messages(messages), true, args);
    return std::vector<int32_t>(rendered.begin(), rendered.end());
  };
  auto parse = [&](const std::string& kwargs) {
    return parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}])" + kwargs + "}", lim, render);
  };
  const std::string plain = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
  for (const std::string kw : {"", R"(, "chat_template_kwargs": null)", R"(, "chat_template_kwargs": {"enable_thinking": true})"}) {
    ASSERT_TRUE(std::holds_alternative<CompletionRequest>(parse(kw))) << kw;
    EXPECT_EQ(rendered, plain) << kw;
  }
  for (const std::string kw : {R"(, "chat_template_kwargs": {"enable_thinking": false})",
                               R"(, "chat_template_kwargs": {"enable_thinking": false, "tools_hint": [1], "x": null})"}) {
    ASSERT_TRUE(std::holds_alternative<CompletionRequest>(parse(kw))) << kw;
    EXPECT_EQ(rendered, plain + "<think>\n\n</think>\n\n") << kw;
  }
  renders = 0;
  for (const std::string kw : {R"(, "chat_template_kwargs": [])", R"(, "chat_template_kwargs": "enable_thinking")",
                               R"(, "chat_template_kwargs": {"enable_thinking": "false"})",
                               R"(, "chat_template_kwargs": {"enable_thinking": 0})"}) {
    auto r = parse(kw);
    const ApiError* e = std::get_if<ApiError>(&r);
    ASSERT_NE(e, nullptr) << kw;
    EXPECT_EQ(e->status, 400);
    EXPECT_EQ(e->param, "chat_template_kwargs") << e->message;
    EXPECT_NE(e->message.find("chat_template_kwargs"), std::string::npos) << e->message;
  }
  EXPECT_EQ(renders, 0);
}

// --prefill-chunk: a prompt longer than the chunk is prefilled a chunk per step, and the running
// sequence decodes between its chunks (decode_steps_during_prefill counts those steps); the long
// request gives exactly what prefill_chunked + decode_step give alone, the short one what it gives
// alone.
TEST(ServeEngine, LongPromptIsPrefilledInChunksWhileOthersDecode) {
  Model m = make_model(tiny_serve_config(), 4);
  EngineOptions o;
  o.prefill_chunk = 4;
  Engine e(m, o);
  GenerationRequest shortr, longr;
  shortr.prompt = {7, 3};
  shortr.max_tokens = 30;
  shortr.sampling = {0.0, 0, 1.0};
  for (int j = 0; j < 18; ++j) longr.prompt.push_back(static_cast<int32_t>((j * 29 + 5) % 97));  // 4+4+4+4+2
  longr.max_tokens = 6;
  longr.sampling = {0.8, 0, 1.0};
  longr.seed = 11;
  e.pause(true);  // both wait: the short one is prefilled whole and decodes while the long one is chunked
  auto s1 = e.submit(shortr), s2 = e.submit(longr);
  ASSERT_TRUE(s1 && s2);
  e.pause(false);
  wait_done(*s1);
  wait_done(*s2);
  EXPECT_EQ(s1->tokens, alone(m, shortr).tokens);
  KVCache cache;
  std::mt19937_64 rng(longr.seed);
  std::vector<float> l = prefill_chunked(m, cache, longr.prompt, 24, 4);
  std::vector<int32_t> expect;
  for (int i = 0; i < 6; ++i) {
    expect.push_back(sample_token(l, longr.sampling, rng));
    if (i < 5) l = decode_step(m, cache, expect.back());
  }
  EXPECT_EQ(s2->tokens, expect);
  // The engine books a step's statistics after marking its sequences done (see above): let it settle.
  EngineStats st = e.stats();
  for (int i = 0; i < 1000 && (st.requests_finished < 2 || st.kv_tokens_used != 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    st = e.stats();
  }
  EXPECT_EQ(st.prefill_chunks, 1 + 5);
  EXPECT_EQ(st.prefills, 2);
  EXPECT_EQ(st.decode_steps_during_prefill, 4);  // after each of the long prompt's first 4 chunks
  EXPECT_EQ(st.prompt_tokens, 20);
  EXPECT_EQ(st.prefilling, 0);
  EXPECT_EQ(st.kv_tokens_used, 0);
}
