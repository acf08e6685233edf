#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>

namespace mxrec {

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::WorkerLoop() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

namespace {
struct ForState {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;  // the first exception an item threw (under mu)
};
}  // namespace

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t helpers = std::min<int64_t>(num_threads_ - 1, n - 1);
  if (helpers <= 0) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto state = std::make_shared<ForState>();
  // An exception thrown by an item (std::bad_alloc above all) must not leave a
  // worker, where it would end the process: it is kept, the items not started
  // yet are skipped, and the caller rethrows it once every claimed item is done.
  auto drain = [state, n, &fn] {
    int64_t finished = 0;
    for (int64_t i = state->next.fetch_add(1); i < n; i = state->next.fetch_add(1)) {
      if (!state->failed.load()) {
        try {
          fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(state->mu);
          if (!state->error) state->error = std::current_exception();
          state->failed.store(true);
        }
      }
      ++finished;
    }
    if (finished > 0 && state->done.fetch_add(finished) + finished == n) {
      std::lock_guard<std::mutex> lock(state->mu);
      state->cv.notify_all();
    }
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      for (int64_t i = 0; i < helpers; ++i) tasks_.emplace_back(drain);
    } catch (const std::bad_alloc&) {
      // Fewer helpers: the caller drains what they would have.
    }
  }
  cv_.notify_all();
  drain();
  // Helpers that start after every item was claimed touch only `state`, which
  // they co-own, and never `fn`, so returning before they run is safe.
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done.load() == n; });
  if (state->error) std::rethrow_exception(state->error);
}

}  // namespace mxrec
