#include "serve/encode_thread.h"

namespace jtok {

EncodeThread::EncodeThread(const Tokenizer& tok) : tok_(tok), thread_([this] { loop(); }) {}

EncodeThread::~EncodeThread() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::vector<int32_t> EncodeThread::encode(const std::string& text, bool with_bos) {
  std::packaged_task<std::vector<int32_t>()> task(
      [&] { return with_bos ? tok_.encode_with_bos(text) : tok_.encode(text); });
  auto result = task.get_future();
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return result.get();
}

void EncodeThread::loop() {
  for (;;) {
    std::packaged_task<std::vector<int32_t>()> task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace jtok
