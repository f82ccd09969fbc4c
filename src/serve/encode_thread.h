// Prompts are encoded on one thread: the BPE keeps a 6 MB piece cache per calling thread
// (src/data/bpe.cpp), and encoding on each of ~100 connection threads grew the resident memory by
// ~600 MB under a 64-client load (measured).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data/tokenizer.h"

namespace jtok {

class EncodeThread {
 public:
  explicit EncodeThread(const Tokenizer& tok);
  ~EncodeThread();
  EncodeThread(const EncodeThread&) = delete;
  EncodeThread& operator=(const EncodeThread&) = delete;
  // tok.encode(text) on the thread (with_bos: tok.encode_with_bos, the tokenizer's BOS first when
  // it has one); rethrows what encode threw.
  std::vector<int32_t> encode(const std::string& text, bool with_bos = false);

 private:
  void loop();
  const Tokenizer& tok_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<std::vector<int32_t>()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace jtok
