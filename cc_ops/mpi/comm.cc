#include "mpi/comm.h"

#include <mpi.h>
#include <sched.h>
#include <time.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

namespace mxrec {
namespace mpi {
namespace {

struct State {
  std::mutex mu;
  bool ready = false;
  Result failure;       // the first failed exchange, or ok
  Result init_failure;  // a failed set-up, or ok
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  int64_t tag_ub = 32767;
};

State& state() {
  static State* s = new State();  // never destroyed: kernels may run at exit
  return *s;
}

Result Error(Code code, std::string message) { return Result{code, std::move(message)}; }

std::string MpiError(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, len);
}

// The first failure poisons every later exchange of the process.
Result Fail(Result result) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.failure.ok()) s.failure = result;
  return result;
}

Result Broken() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.failure.ok()) return Result::Ok();
  return Error(Code::kAborted,
               "an earlier exchange of this rank failed, so the ranks' exchanges no longer line "
               "up; restart the job. The first failure: " + s.failure.message);
}

// How long a wait yields before it sleeps, and sleeps 50 us before 500 us (Clock::Pause).
constexpr std::chrono::milliseconds kYieldFor{3};
constexpr std::chrono::milliseconds kShortSleepsFor{100};

// Timeouts from this many seconds on (infinity included) never expire: a longer
// one would overflow the clock's nanoseconds.
constexpr double kNeverSeconds = 1e9;

class Clock {
 public:
  explicit Clock(double timeout_seconds)
      : start_(std::chrono::steady_clock::now()),
        deadline_(timeout_seconds < kNeverSeconds
                      ? start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                     std::chrono::duration<double>(timeout_seconds))
                      : std::chrono::steady_clock::time_point::max()) {}
  bool expired() const { return std::chrono::steady_clock::now() > deadline_; }
  // Spins briefly (an exchange between ranks of one host answers in microseconds), then
  // yields the core for the first kYieldFor of the wait: sched_yield runs any thread that
  // is ready first (another rank's compute on a shared core), and the waiter sees its
  // peer's message at once. A sleeping waiter wakes up late (the sleep, its timer slack,
  // a halted core's wake-up) at each of a step's exchanges, one after the other; with
  // 50 us sleeps from the 128th poll, perf counted 15 % of 2 streaming ranks' core time
  // idle. After kYieldFor it sleeps, longer and longer, so that a long wait (a peer
  // saving, a lagging input) takes little of a core (tests/mpi_ops_worker.py, timeout).
  void Pause() {
    ++polls_;
    if (polls_ < 64) return;
    const auto waited = std::chrono::steady_clock::now() - start_;
    if (waited < kYieldFor) {
      sched_yield();
      return;
    }
    const long ns = waited < kShortSleepsFor ? 50000 : 500000;
    timespec ts{0, ns};
    nanosleep(&ts, nullptr);
  }

 private:
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point deadline_;
  int64_t polls_ = 0;
};

Result Timeout(const std::string& exchange, double timeout_seconds, int waiting_for) {
  return Fail(Error(
      Code::kDeadlineExceeded,
      "exchange '" + exchange + "' on rank " + std::to_string(state().rank) + " of " +
          std::to_string(state().size) + " timed out after " + std::to_string(timeout_seconds) +
          " s waiting for rank " + std::to_string(waiting_for) +
          " (a rank died, stopped, or runs a different model); raise MXREC_COLLECTIVE_TIMEOUT "
          "if the ranks are only slow"));
}

Result CheckChannel(int64_t channel, const std::string& exchange) {
  if (channel < 0 || channel > state().tag_ub) {
    return Error(Code::kInvalidArgument,
                 "exchange '" + exchange + "': channel " + std::to_string(channel) +
                     " is outside MPI's tags [0, " + std::to_string(state().tag_ub) + "]");
  }
  return Result::Ok();
}

Result CheckBytes(int64_t bytes, const std::string& exchange, int peer) {
  if (bytes < 0 || bytes > INT32_MAX) {
    return Error(Code::kInvalidArgument,
                 "exchange '" + exchange + "': " + std::to_string(bytes) + " bytes for rank " +
                     std::to_string(peer) + " exceed one MPI message (2^31 - 1 bytes); use "
                     "smaller batches or more ranks");
  }
  return Result::Ok();
}

Result WaitAll(std::vector<MPI_Request>* requests, const std::vector<int>& peers, Clock* clock,
               const std::string& exchange, double timeout_seconds) {
  while (true) {
    int done = 0;
    int rc = MPI_Testall(static_cast<int>(requests->size()), requests->data(), &done,
                         MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      return Fail(Error(Code::kInternal, "exchange '" + exchange + "': " + MpiError(rc)));
    }
    if (done) return Result::Ok();
    if (clock->expired()) {
      int waiting = -1;
      for (size_t i = 0; i < requests->size(); ++i) {
        if ((*requests)[i] != MPI_REQUEST_NULL) {
          waiting = peers[i];
          break;
        }
      }
      return Timeout(exchange, timeout_seconds, waiting);
    }
    clock->Pause();
  }
}

}  // namespace

Result Initialize() { return Initialize(kDefaultInitTimeout); }

Result Initialize(double timeout_seconds) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.init_failure.ok()) return s.init_failure;
  if (s.ready) return Result::Ok();
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return Error(Code::kInternal, "MPI_Init_thread: " + MpiError(rc));
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    return Error(Code::kInternal,
                 "MPI was initialised without MPI_THREAD_MULTIPLE (level " +
                     std::to_string(provided) + "); mxrec's exchanges run on several threads. "
                     "Initialise with MPI_Init_thread(MPI_THREAD_MULTIPLE) (mpi4py's default)");
  }
  // Collective over every rank: bounded like any other wait.
  MPI_Request request;
  int rc = MPI_Comm_idup(MPI_COMM_WORLD, &s.comm, &request);
  if (rc != MPI_SUCCESS) return Error(Code::kInternal, "MPI_Comm_idup: " + MpiError(rc));
  Clock clock(timeout_seconds);
  while (true) {
    int done = 0;
    rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return Error(Code::kInternal, "MPI_Comm_idup: " + MpiError(rc));
    if (done) break;
    if (clock.expired()) {
      int world_rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
      s.init_failure = Error(Code::kDeadlineExceeded,
                        "mxrec's MPI set-up on rank " + std::to_string(world_rank) +
                            " timed out after " + std::to_string(timeout_seconds) +
                            " s: not every rank of the MPI job started mxrec's exchanges "
                            "(every rank must call init(); raise MXREC_COLLECTIVE_TIMEOUT if "
                            "they are only slow)");
      return s.init_failure;
    }
    clock.Pause();
  }
  MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(s.comm, &s.rank);
  MPI_Comm_size(s.comm, &s.size);
  void* value = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &found);
  if (found) s.tag_ub = *static_cast<int*>(value);
  s.ready = true;
  return Result::Ok();
}

int Rank() { return state().rank; }
int Size() { return state().size; }

namespace {

// Alltoallv with the bytes for rank p at send[p].
Result Exchange(int64_t channel, const std::string& exchange, const std::vector<const char*>& send,
                const std::vector<int64_t>& send_bytes, const Allocate& allocate,
                double timeout_seconds) {
  Result r = Initialize();
  if (!r.ok()) return r;
  if (!(r = Broken()).ok()) return r;
  if (!(r = CheckChannel(channel, exchange)).ok()) return r;
  State& s = state();
  const int n = s.size;
  if (static_cast<int>(send_bytes.size()) != n) {
    return Error(Code::kInvalidArgument, "exchange '" + exchange + "': " +
                                             std::to_string(send_bytes.size()) +
                                             " send counts for " + std::to_string(n) + " ranks");
  }
  const int tag = static_cast<int>(channel);
  for (int p = 0; p < n; ++p) {
    if (!(r = CheckBytes(send_bytes[p], exchange, p)).ok()) return r;
  }
  Clock clock(timeout_seconds);
  std::vector<MPI_Request> sends;
  std::vector<int> send_peers;
  for (int k = 1; k < n; ++k) {  // rank + k: every rank starts with a different peer
    const int p = (s.rank + k) % n;
    MPI_Request req;
    int rc = MPI_Isend(send[p], static_cast<int>(send_bytes[p]), MPI_BYTE, p, tag,
                       s.comm, &req);
    if (rc != MPI_SUCCESS) {
      return Fail(Error(Code::kInternal, "exchange '" + exchange + "': " + MpiError(rc)));
    }
    sends.push_back(req);
    send_peers.push_back(p);
  }
  // The sizes arrive with the messages: probe every peer, then allocate once.
  std::vector<int64_t> recv_bytes(n, 0);
  std::vector<MPI_Message> messages(n, MPI_MESSAGE_NULL);
  recv_bytes[s.rank] = send_bytes[s.rank];
  int missing = n - 1;
  while (missing > 0) {
    for (int k = 1; k < n; ++k) {
      const int p = (s.rank + n - k) % n;
      if (messages[p] != MPI_MESSAGE_NULL) continue;
      int flag = 0;
      MPI_Status status;
      int rc = MPI_Improbe(p, tag, s.comm, &flag, &messages[p], &status);
      if (rc != MPI_SUCCESS) {
        return Fail(Error(Code::kInternal, "exchange '" + exchange + "': " + MpiError(rc)));
      }
      if (flag) {
        int count = 0;
        MPI_Get_count(&status, MPI_BYTE, &count);
        recv_bytes[p] = count;
        --missing;
      }
    }
    if (missing == 0) break;
    if (clock.expired()) {
      for (int k = 1; k < n; ++k) {
        const int p = (s.rank + n - k) % n;
        if (messages[p] == MPI_MESSAGE_NULL) return Timeout(exchange, timeout_seconds, p);
      }
    }
    clock.Pause();
  }
  Result alloc_error;
  char* out = allocate(recv_bytes, &alloc_error);
  if (out == nullptr) {
    // The probed messages must still be received, or they would meet the next run.
    for (int p = 0; p < n; ++p) {
      if (messages[p] == MPI_MESSAGE_NULL) continue;
      std::vector<char> sink(recv_bytes[p]);
      MPI_Mrecv(sink.data(), static_cast<int>(recv_bytes[p]), MPI_BYTE, &messages[p],
                MPI_STATUS_IGNORE);
    }
    WaitAll(&sends, send_peers, &clock, exchange, timeout_seconds);
    return alloc_error.ok() ? Error(Code::kInternal, "exchange '" + exchange + "': allocation")
                            : alloc_error;
  }
  std::vector<int64_t> recv_offset(n + 1, 0);
  for (int p = 0; p < n; ++p) recv_offset[p + 1] = recv_offset[p] + recv_bytes[p];
  std::memcpy(out + recv_offset[s.rank], send[s.rank], send_bytes[s.rank]);
  std::vector<MPI_Request> recvs;
  std::vector<int> recv_peers;
  for (int p = 0; p < n; ++p) {
    if (p == s.rank) continue;
    MPI_Request req;
    int rc = MPI_Imrecv(out + recv_offset[p], static_cast<int>(recv_bytes[p]), MPI_BYTE,
                        &messages[p], &req);
    if (rc != MPI_SUCCESS) {
      return Fail(Error(Code::kInternal, "exchange '" + exchange + "': " + MpiError(rc)));
    }
    recvs.push_back(req);
    recv_peers.push_back(p);
  }
  if (!(r = WaitAll(&recvs, recv_peers, &clock, exchange, timeout_seconds)).ok()) return r;
  return WaitAll(&sends, send_peers, &clock, exchange, timeout_seconds);
}

}  // namespace

Result Alltoallv(int64_t channel, const std::string& exchange, const char* send,
                 const std::vector<int64_t>& send_bytes, const Allocate& allocate,
                 double timeout_seconds) {
  std::vector<const char*> parts(send_bytes.size());
  int64_t offset = 0;
  for (size_t p = 0; p < send_bytes.size(); ++p) {
    parts[p] = send + offset;
    offset += send_bytes[p] > 0 ? send_bytes[p] : 0;
  }
  return Exchange(channel, exchange, parts, send_bytes, allocate, timeout_seconds);
}

namespace {

template <typename T>
void Reduce(T* acc, const T* other, int64_t count, Reduction reduction) {
  switch (reduction) {
    case Reduction::kSum:
      for (int64_t i = 0; i < count; ++i) acc[i] += other[i];
      break;
    case Reduction::kMax:
      for (int64_t i = 0; i < count; ++i) acc[i] = other[i] > acc[i] ? other[i] : acc[i];
      break;
    case Reduction::kMin:
      for (int64_t i = 0; i < count; ++i) acc[i] = other[i] < acc[i] ? other[i] : acc[i];
      break;
  }
}

int64_t ElementBytes(DType dtype) {
  return dtype == DType::kFloat64 || dtype == DType::kInt64 ? 8 : 4;
}

void ReduceAny(char* acc, const char* other, int64_t count, DType dtype, Reduction reduction) {
  switch (dtype) {
    case DType::kFloat32:
      Reduce(reinterpret_cast<float*>(acc), reinterpret_cast<const float*>(other), count,
             reduction);
      break;
    case DType::kFloat64:
      Reduce(reinterpret_cast<double*>(acc), reinterpret_cast<const double*>(other), count,
             reduction);
      break;
    case DType::kInt32:
      Reduce(reinterpret_cast<int32_t*>(acc), reinterpret_cast<const int32_t*>(other), count,
             reduction);
      break;
    case DType::kInt64:
      Reduce(reinterpret_cast<int64_t*>(acc), reinterpret_cast<const int64_t*>(other), count,
             reduction);
      break;
  }
}

}  // namespace

Result Allreduce(int64_t channel, const std::string& exchange, char* data, int64_t count,
                 DType dtype, Reduction reduction, double timeout_seconds) {
  Result r = Initialize();
  if (!r.ok()) return r;
  // Checked on one rank too, so that a bad channel fails before the job has peers.
  if (!(r = CheckChannel(channel, exchange)).ok()) return r;
  const int n = Size();
  if (n == 1) return Broken();
  const int64_t bytes = count * ElementBytes(dtype);
  // Every rank sends its whole buffer to every peer (an all-gather), then reduces in
  // rank order: one round of messages, and the same bits on every rank.
  std::vector<int64_t> send_bytes(n, bytes);
  std::vector<const char*> send(n, data);
  std::vector<char> gathered;
  Result size_error;
  Allocate allocate = [&](const std::vector<int64_t>& recv_bytes, Result* error) -> char* {
    for (int p = 0; p < n; ++p) {
      if (recv_bytes[p] != bytes) {
        *error = Fail(Error(Code::kInvalidArgument,
                            "exchange '" + exchange + "': rank " + std::to_string(p) + " sent " +
                                std::to_string(recv_bytes[p]) + " bytes, rank " +
                                std::to_string(Rank()) + " " + std::to_string(bytes) +
                                " (the ranks built different models, or built their graphs "
                                "in different orders)"));
        return nullptr;
      }
    }
    gathered.resize(bytes * n + 1);  // +1: a non-null buffer for empty tensors too
    return gathered.data();
  };
  r = Exchange(channel, exchange, send, send_bytes, allocate, timeout_seconds);
  if (!r.ok()) return r;
  std::memcpy(data, gathered.data(), bytes);
  for (int p = 1; p < n; ++p) ReduceAny(data, gathered.data() + p * bytes, count, dtype, reduction);
  return Result::Ok();
}

namespace {

// Threads that run exchanges, started when every thread is busy: an exchange
// waits for its peers, and a fixed pool could hold all its threads in exchanges
// whose peers wait for one queued behind them.
class Pool {
 public:
  void Schedule(std::function<void()> task) {
    std::unique_lock<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    // Tasks not yet taken are still queued, so this counts every claim on the idle threads.
    if (tasks_.size() > static_cast<size_t>(idle_)) {
      std::thread([this] { Work(); }).detach();
    } else {
      cv_.notify_one();
    }
  }

 private:
  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      ++idle_;
      cv_.wait(lock, [this] { return !tasks_.empty(); });
      --idle_;
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  int idle_ = 0;
};

}  // namespace

void Schedule(std::function<void()> task) {
  static Pool* pool = new Pool();  // never destroyed: its threads outlive static destruction
  pool->Schedule(std::move(task));
}

}  // namespace mpi
}  // namespace mxrec

// For Python (ctypes): the collective set-up at init(), with the collective timeout.
// Returns the Code as an int; on failure `message` holds the reason.
extern "C" __attribute__((visibility("default"))) int mxrec_mpi_initialize(
    double timeout_seconds, int* rank, int* size, char* message, int capacity) {
  mxrec::mpi::Result r = mxrec::mpi::Initialize(timeout_seconds);
  *rank = mxrec::mpi::Rank();
  *size = mxrec::mpi::Size();
  if (capacity > 0) {
    std::snprintf(message, capacity, "%s", r.message.c_str());
  }
  return static_cast<int>(r.code);
}
