// mxrec's exchanges between ranks over MPI, with no TensorFlow types.
//
// Every exchange (one op instance of a graph, one direction of a lookup) has a
// channel: an integer the ranks assign in the same order when they build the
// same graph. Its messages carry the channel as their MPI tag on one
// communicator of mxrec's own (MPI_Comm_dup of MPI_COMM_WORLD, so the user's
// and mpi4py's traffic never mixes with it). Point-to-point messages of
// different tags never match each other, so exchanges running at the same time
// on different threads never interleave, in whatever order each rank starts
// them; messages of one tag between two ranks arrive in the order they were
// sent (MPI's non-overtaking rule), so consecutive runs of one exchange line up.
//
// Why not a communicator per channel: MPI_Comm_dup is collective and must be
// called in the same order on every rank, which kernels constructed lazily by
// TensorFlow's executor do not guarantee; MPI_Comm_create_from_group (MPI-4,
// ordered by a string tag) hung with concurrent creations under Open MPI 5.0.11.
//
// Every wait is bounded: the calls are nonblocking and a test loop stops at the
// deadline with kDeadlineExceeded naming the exchange. After a timeout the
// channel's messages can no longer be trusted, so every later exchange of this
// process fails at once with the first failure (kAborted).
#ifndef MXREC_MPI_COMM_H_
#define MXREC_MPI_COMM_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mxrec {
namespace mpi {

enum class Code { kOk, kInvalidArgument, kDeadlineExceeded, kAborted, kInternal };

struct Result {
  Code code = Code::kOk;
  std::string message;
  bool ok() const { return code == Code::kOk; }
  static Result Ok() { return Result(); }
};

enum class DType { kFloat32, kFloat64, kInt32, kInt64 };
enum class Reduction { kSum, kMax, kMin };

// Where one exchange's received bytes go: called once with the bytes coming
// from each rank (in rank order, this rank's own included); returns a buffer of
// their sum, or nullptr with `*error` set.
using Allocate = std::function<char*(const std::vector<int64_t>& recv_bytes, Result* error)>;

// Initialises MPI (MPI_THREAD_MULTIPLE) unless mpi4py or the program did, and
// creates mxrec's communicator, which is collective: every rank must call it (mxrec's
// init() does, through mxrec_mpi_initialize), and a rank whose peers do not join within
// `timeout_seconds` fails. Safe to call from any thread, any number of times; later calls
// return the first call's outcome.
constexpr double kDefaultInitTimeout = 300.0;
Result Initialize(double timeout_seconds);
Result Initialize();
int Rank();
int Size();

// Variable-size all-to-all: `send_bytes[r]` bytes from `send` (consecutive, in
// rank order) go to rank r; what rank r sends here lands at the r-th slice of
// the buffer `allocate` returns. The sizes travel with the messages (a probe
// reads them), so no separate count exchange is needed.
Result Alltoallv(int64_t channel, const std::string& exchange, const char* send,
                 const std::vector<int64_t>& send_bytes, const Allocate& allocate,
                 double timeout_seconds);

// In-place reduction of `count` elements over all ranks. Every rank receives
// every rank's buffer and reduces them in rank order, so the result is bitwise
// the same on every rank. Buffers of different sizes are an error naming the
// exchange and both sizes.
Result Allreduce(int64_t channel, const std::string& exchange, char* data, int64_t count,
                 DType dtype, Reduction reduction, double timeout_seconds);

// Runs `task` on a thread of mxrec's exchange pool (never on the caller's): a
// thread per exchange in flight, so a waiting exchange never holds up another.
void Schedule(std::function<void()> task);

}  // namespace mpi
}  // namespace mxrec

#endif  // MXREC_MPI_COMM_H_
