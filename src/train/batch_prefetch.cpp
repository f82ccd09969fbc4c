// One batch read ahead on a worker thread (train/batch_prefetch.h).
#include "train/batch_prefetch.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace jtok {

namespace {

// The inner source is touched by the worker only while a read is asked and not yet done, and by the
// caller's thread only otherwise (every method first waits for the read in flight).
class BatchPrefetcher {
 public:
  explicit BatchPrefetcher(BatchSource inner) : inner_(std::move(inner)), worker_([this] { work(); }) {}
  ~BatchPrefetcher() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  void next(int32_t* x, int32_t* y, int64_t B, int64_t T) {
    if (ready(B, T)) {
      std::copy(x_.begin(), x_.end(), x);
      std::copy(y_.begin(), y_.end(), y);
      ahead_ = Ahead::kNone;
    } else {
      inner_.next(x, y, B, T);
    }
    consumed_ = inner_.state();  // the position after this batch: what a checkpoint saves
    ask(B, T);
  }

  void peek(int64_t n, int32_t* x, int64_t B, int64_t T) {
    if (n <= 0) return;
    if (!ready(B, T)) {
      inner_.peek(n, x, B, T);
      return;
    }
    std::copy(x_.begin(), x_.end(), x);  // the batch read ahead is the first of the next n, and stays ahead
    if (n > 1) inner_.peek(n - 1, x + B * T, B, T);
  }

  // The position after the batches next() gave, a batch read ahead (or whose read failed) not counted.
  nlohmann::json state() {
    wait();
    return ahead_ == Ahead::kNone ? inner_.state() : consumed_;
  }

  void restore(const nlohmann::json& j) {
    wait();
    ahead_ = Ahead::kNone, error_ = nullptr;
    inner_.restore(j);
  }

 private:
  enum class Ahead { kNone, kReady, kFailed };

  // True when a batch of shape (B, T) is read ahead (in x_, y_). Otherwise none is: the source is
  // where the caller left it (a batch of another shape put back). A failed read throws its error here,
  // where that batch is asked for.
  bool ready(int64_t B, int64_t T) {
    wait();
    if (ahead_ == Ahead::kReady && B == B_ && T == T_) return true;
    const Ahead a = ahead_;
    ahead_ = Ahead::kNone;
    if (a != Ahead::kNone) inner_.restore(consumed_);
    if (a == Ahead::kFailed) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
    return false;
  }

  void ask(int64_t B, int64_t T) {
    B_ = B, T_ = T;
    x_.resize(static_cast<size_t>(B * T)), y_.resize(static_cast<size_t>(B * T));
    {
      std::lock_guard<std::mutex> lk(mu_);
      asked_ = true;
    }
    cv_.notify_all();
  }

  void wait() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [this] { return !asked_; });
  }

  void work() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [this] { return asked_ || stop_; });
      if (stop_) return;
      lk.unlock();
      std::exception_ptr err;
      try {
        inner_.next(x_.data(), y_.data(), B_, T_);
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      ahead_ = err ? Ahead::kFailed : Ahead::kReady;
      error_ = err;
      asked_ = false;
      cv_.notify_all();
    }
  }

  BatchSource inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool asked_ = false, stop_ = false;  // under mu_
  // The worker's while asked_, else the caller's: the batch read ahead, its shape, a failed read's error.
  Ahead ahead_ = Ahead::kNone;
  int64_t B_ = 0, T_ = 0;
  std::vector<int32_t> x_, y_;
  std::exception_ptr error_;
  nlohmann::json consumed_;  // the source's state after the batches next() gave
  std::thread worker_;       // last: started once every member above is made
};

}  // namespace

BatchSource prefetching(BatchSource inner) {
  JTOK_CHECK(inner.next && inner.state && inner.restore, "prefetching: the batch source has no next, state or restore");
  const bool can_peek = static_cast<bool>(inner.peek);
  auto p = std::make_shared<BatchPrefetcher>(std::move(inner));
  BatchSource s;
  s.next = [p](int32_t* x, int32_t* y, int64_t B, int64_t T) { p->next(x, y, B, T); };
  if (can_peek) s.peek = [p](int64_t n, int32_t* x, int64_t B, int64_t T) { p->peek(n, x, B, T); };
  s.state = [p] { return p->state(); };
  s.restore = [p](const nlohmann::json& j) { p->restore(j); };
  return s;
}

}  // namespace jtok
