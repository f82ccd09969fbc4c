// The HTTP face of the engine, with the OpenAI API conventions (cpp-httplib):
//   POST /v1/completions  prompt (text or token ids), max_tokens, temperature, top_p, top_k, seed,
//                         stop, stream (server-sent events), logprobs, echo, n, best_of, usage
//                         counts (src/serve/completions_route.h)
//   POST /v1/chat/completions  messages rendered by the model's chat template (chat_template.h),
//                         the same sampling, stop, stream and n; replies in the chat format
//   GET  /v1/models, GET /health, GET /metrics (Prometheus text)
// Bad input is answered 4xx with an OpenAI-style body {"error": {"message", "type", "param", "code"}}
// and the server goes on. With an API key, /v1/* without "Authorization: Bearer KEY" gets 401.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "data/tokenizer.h"
#include "serve/engine.h"

namespace jtok {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: any free port (reported through on_listen)
  std::string api_key;             // empty: no authentication
  std::string model_id = "jtok";   // the name /v1/models lists and requests may give
  size_t max_body_bytes = 1 << 20; // larger request bodies get 413
  int http_threads = 96;           // connections served at once
  std::string tables = "ram";      // for /metrics: where the token tables live
  int64_t max_n = 8;               // n and best_of of /v1/completions at most (and at most the engine's max_batch)
  std::string chat_template_dir;   // where tokenizer_config.json (its chat_template) is; "" none
  std::string chat_template;       // "chatml" | "qwen3" | "llama3": the family, instead of detecting it
  bool exit_on_device_loss = true;  // the engine's device lost (Engine::device_lost): the server stops
                                    // and run() throws DeviceLost; false: it answers 503 until stopped
};

class HttpApi {
 public:
  HttpApi(Engine& engine, const Tokenizer& tokenizer, ServeOptions opt);
  ~HttpApi();
  // Binds (errors name host:port), calls on_listen(port), and serves until stop(), or with
  // exit_on_device_loss until the engine's device is lost: then it throws DeviceLost once the requests
  // the loss cut have their answers.
  void run(const std::function<void(int)>& on_listen);
  // From any thread, at any time (before run(), inside on_listen, while serving): run() returns within
  // ~20 ms of it, once the handlers under way have answered. Does not wait.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace jtok
