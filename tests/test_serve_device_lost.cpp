// A lost device (jtok::DeviceLost: CUDA's sticky errors, cuda/check.h) in the serving engine and its
// HTTP API, on the CPU decoder made to throw it at a chosen step: the running and queued requests end
// with the message, no step runs after it, new requests are refused (the API's 503 device_lost), and
// /health and /metrics say so; a request before the loss is served as usual. And HttpApi::stop(),
// which the loss watch shares: kept when it lands before the server listens.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "core/error.h"
#include "data/tokenizer.h"
#include "serve/engine.h"
#include "serve/http_api.h"
#include "serve_test_util.h"

using namespace jtok;
using namespace jtok::testing;

namespace {

// The CPU decoder until its device is "lost": from call `lose_at` (0-based, prefills and decode steps
// counted together) on, every step throws DeviceLost, as a GPU decoder's sticky CUDA error does.
class LosingDecoder final : public Decoder {
 public:
  LosingDecoder(const Model& m, int64_t lose_at, int64_t& calls)
      : cpu_(make_cpu_decoder(m, false)), lose_at_(lose_at), calls_(calls) {}
  std::string describe() const override { return "losing test decoder"; }
  int64_t vocab_size() const override { return cpu_->vocab_size(); }
  int64_t open(int64_t capacity) override { return cpu_->open(capacity); }
  void close(int64_t seq) override { cpu_->close(seq); }
  int64_t fork(int64_t seq, int64_t capacity) override { return cpu_->fork(seq, capacity); }
  int64_t length(int64_t seq) const override { return cpu_->length(seq); }
  int64_t capacity(int64_t seq) const override { return cpu_->capacity(seq); }
  std::vector<float> prefill(int64_t seq, const int32_t* tokens, int64_t n, const PositionLogits& each) override {
    step();
    return cpu_->prefill(seq, tokens, n, each);
  }
  int64_t decode(const int64_t* seqs, const int32_t* tokens, int64_t M, float* logits) override {
    step();
    return cpu_->decode(seqs, tokens, M, logits);
  }
  int64_t decode_pick(const int64_t* seqs, const int32_t* tokens, int64_t M, const PickRequest* req,
                      TokenPick* out) override {
    step();
    return cpu_->decode_pick(seqs, tokens, M, req, out);
  }
  int64_t keep_block(int64_t seq, int64_t first, int64_t n) override { return cpu_->keep_block(seq, first, n); }
  void drop_block(int64_t block) override { cpu_->drop_block(block); }
  int64_t open_from_blocks(const std::vector<int64_t>& blocks, int64_t capacity) override {
    return cpu_->open_from_blocks(blocks, capacity);
  }

 private:
  void step() {
    if (calls_++ >= lose_at_) throw DeviceLost("test: cudaErrorIllegalAddress; the GPU's context is lost");
  }
  std::unique_ptr<Decoder> cpu_;
  int64_t lose_at_;
  int64_t& calls_;
};

EngineOptions batch_of_two() {
  EngineOptions o;
  o.max_batch = 2;
  o.ctx = 32;
  return o;
}

GenerationRequest request(std::vector<int32_t> prompt, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

}  // namespace

// A lost device (a step's DeviceLost): the running and the queued requests end with "error" and its
// message, no step runs after it, the engine says so (device_lost, stats) and refuses new requests with
// DeviceLost (the server's 503), bad ones still with their own error.
TEST(ServeDeviceLost, TheEngineEndsEveryRequestAndRefusesNewOnes) {
  Model m = make_model(tiny_serve_config(), 4);
  const EngineOptions o = batch_of_two();
  int64_t calls = 0;
  Engine e(m, o, std::make_unique<LosingDecoder>(m, 4, calls));  // 2 prefills, 2 decode steps, then lost
  e.pause(true);
  auto a = e.submit(request({1, 2, 3}, 10)), b = e.submit(request({4, 5}, 10)), c = e.submit(request({6}, 10));
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(e.device_lost(), "");
  e.pause(false);
  for (auto* s : {a.get(), b.get(), c.get()}) {
    wait_done(*s);
    EXPECT_EQ(s->finish_reason, "error");
    EXPECT_NE(s->error.find("context is lost"), std::string::npos) << s->error;
  }
  EXPECT_EQ(a->tokens.size(), 3u);  // its prefill's token and two decode steps'
  EXPECT_EQ(b->tokens.size(), 3u);
  EXPECT_TRUE(c->tokens.empty());  // queued behind the batch of 2: never ran
  EXPECT_NE(e.device_lost().find("context is lost"), std::string::npos) << e.device_lost();
  EXPECT_TRUE(e.stats().device_lost);
  EXPECT_EQ(e.stats().queue_depth, 0);
  try {
    e.submit(request({7}, 3));
    ADD_FAILURE() << "a request after the loss was taken";
  } catch (const DeviceLost& x) {
    EXPECT_NE(std::string(x.what()).find("device was lost"), std::string::npos) << x.what();
  }
  EXPECT_THROW(e.submit(request({}, 3)), Error);  // still its own message
  EXPECT_EQ(calls, 5);                            // the step that threw was the last
}

// The HTTP API over it, kept alive after the loss: a request before the loss gets its tokens; the one the loss cuts
// gets 500 naming it; after it a request gets 503 (code device_lost), /health 503 with the message, /metrics
// jtok_device_lost 1, and bad requests still their 400.
TEST(ServeDeviceLost, TheApiAnswers503AndHealthSaysSo) {
  Model m = make_model(tiny_serve_config(), 4);
  const EngineOptions o = batch_of_two();
  int64_t calls = 0;
  Engine e(m, o, std::make_unique<LosingDecoder>(m, 6, calls));  // 1 prefill + 3 steps, then 1 + 1, lost
  const Tokenizer tok = Tokenizer::load("gpt2", std::string(std::getenv("JTOK_ROOT")) + "/tests/data/bit_identity");
  ServeOptions so;
  so.port = 0;
  so.http_threads = 4;
  so.exit_on_device_loss = false;  // serve --keep-alive-on-device-loss
  HttpApi api(e, tok, so);
  std::promise<int> bound;
  std::thread server([&] { api.run([&](int port) { bound.set_value(port); }); });
  httplib::Client cli("127.0.0.1", bound.get_future().get());
  cli.set_read_timeout(30, 0);
  const std::string body = R"({"model": "jtok", "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0})";
  auto first = cli.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, 200) << first->body;
  EXPECT_EQ(cli.Get("/health")->status, 200);
  auto cut = cli.Post("/v1/completions", R"({"model": "jtok", "prompt": [4, 5], "max_tokens": 8})", "application/json");
  ASSERT_TRUE(cut);
  EXPECT_EQ(cut->status, 500) << cut->body;
  EXPECT_NE(cut->body.find("context is lost"), std::string::npos) << cut->body;
  auto after = cli.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 503) << after->body;
  EXPECT_EQ(nlohmann::json::parse(after->body)["error"]["code"], "device_lost") << after->body;
  auto health = cli.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(nlohmann::json::parse(health->body)["status"], "device_lost") << health->body;
  EXPECT_NE(cli.Get("/metrics")->body.find("jtok_device_lost 1"), std::string::npos);
  EXPECT_EQ(cli.Post("/v1/completions", "{", "application/json")->status, 400);  // bad JSON: still its own 400
  api.stop();
  server.join();
  EXPECT_EQ(calls, 7);
}

// By default the server stops after the loss (as vLLM's does when its engine dies), for a supervisor to
// start it again: the request the loss cut still gets its 500 naming it, then run() returns by throwing
// DeviceLost, which says how to keep the server up.
TEST(ServeDeviceLost, TheServerStopsAfterTheLossByDefault) {
  Model m = make_model(tiny_serve_config(), 4);
  const EngineOptions o = batch_of_two();
  int64_t calls = 0;
  Engine e(m, o, std::make_unique<LosingDecoder>(m, 2, calls));  // 1 prefill + 1 step, then lost
  const Tokenizer tok = Tokenizer::load("gpt2", std::string(std::getenv("JTOK_ROOT")) + "/tests/data/bit_identity");
  ServeOptions so;
  so.port = 0;
  so.http_threads = 4;
  HttpApi api(e, tok, so);
  std::promise<int> bound;
  std::promise<std::string> ended;  // what run() threw ("" if it returned)
  std::thread server([&] {
    try {
      api.run([&](int port) { bound.set_value(port); });
      ended.set_value("");
    } catch (const DeviceLost& x) {
      ended.set_value(x.what());
    } catch (const std::exception& x) {
      ended.set_value(std::string("not DeviceLost: ") + x.what());
    }
  });
  auto run_ended = ended.get_future();
  httplib::Client cli("127.0.0.1", bound.get_future().get());
  cli.set_read_timeout(30, 0);
  auto cut = cli.Post("/v1/completions", R"({"model": "jtok", "prompt": [4, 5], "max_tokens": 8})", "application/json");
  ASSERT_TRUE(cut);
  EXPECT_EQ(cut->status, 500) << cut->body;
  EXPECT_NE(cut->body.find("context is lost"), std::string::npos) << cut->body;
  if (run_ended.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "the server still runs 20 s after the loss";
    api.stop();
  } else {
    const std::string why = run_ended.get();
    EXPECT_NE(why.find("device was lost"), std::string::npos) << why;
    EXPECT_NE(why.find("context is lost"), std::string::npos) << why;
    EXPECT_NE(why.find("--keep-alive-on-device-loss"), std::string::npos) << why;
  }
  server.join();
  EXPECT_FALSE(cli.Get("/health"));  // nothing listens any more
  EXPECT_EQ(calls, 3);
}

// stop() lands wherever it is called: inside on_listen (bound, not yet listening: the HTTP library
// drops a stop there) and before run() at all, run() still returns, within a bound.
TEST(ServeStop, AStopBeforeTheServerListensIsKept) {
  Model m = make_model(tiny_serve_config(), 4);
  Engine e(m, batch_of_two(), make_cpu_decoder(m, false));
  const Tokenizer tok = Tokenizer::load("gpt2", std::string(std::getenv("JTOK_ROOT")) + "/tests/data/bit_identity");
  ServeOptions so;
  so.port = 0;
  so.http_threads = 2;
  for (const bool before_run : {false, true}) {
    HttpApi api(e, tok, so);
    if (before_run) api.stop();
    std::promise<void> ended;
    std::thread server([&] {
      api.run([&](int) { api.stop(); });
      ended.set_value();
    });
    const bool returned = ended.get_future().wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    EXPECT_TRUE(returned) << "run() still serves 10 s after stop()" << (before_run ? " (before run)" : "");
    if (!returned) {  // a server thread that never returns: no join to hang on
      std::fflush(nullptr);
      std::quick_exit(1);
    }
    server.join();
  }
}
