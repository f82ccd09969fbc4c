#include "store/read_pool.h"

#include "core/error.h"

namespace jtok {

ReadPool::ReadPool(int threads, std::function<void(int64_t)> work) : work_(std::move(work)) {
  JTOK_CHECK(threads >= 1, "read pool: ", threads, " threads");
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
}

ReadPool::~ReadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    items_.clear();
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ReadPool::submit(const std::vector<int64_t>& items) {
  if (items.empty()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    items_.insert(items_.end(), items.begin(), items.end());
  }
  if (items.size() == 1) cv_.notify_one();
  else cv_.notify_all();
}

void ReadPool::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_.wait(lk, [&] { return items_.empty() && busy_ == 0; });
}

void ReadPool::loop() {
  for (;;) {
    int64_t item;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !items_.empty(); });
      if (stop_) return;
      item = items_.front();
      items_.pop_front();
      busy_++;
    }
    work_(item);
    {
      std::lock_guard<std::mutex> lk(mu_);
      busy_--;
    }
    idle_.notify_all();
  }
}

}  // namespace jtok
