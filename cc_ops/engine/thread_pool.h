// A fixed-size worker pool for the host key stage.
#ifndef MXREC_ENGINE_THREAD_POOL_H_
#define MXREC_ENGINE_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mxrec {

class ThreadPool {
 public:
  // num_threads counts the calling thread: a pool of 1 runs everything inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn(i) for i in [0, n) and returns when all have run. The caller works
  // too and claims items itself, so a ParallelFor nested inside another one
  // never waits on a queue that only blocked workers could drain. An exception
  // thrown by fn on any thread is rethrown here, after every item that started
  // has finished; items not started by then are skipped.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void WorkerLoop();

  int num_threads_;
  std::vector<std::thread> workers_;
  std::deque<std::function<void()>> tasks_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_THREAD_POOL_H_
