// Kernels of the MPI exchanges: thin adapters over mpi/comm.h. Each runs its
// exchange on a thread of the exchange pool, never on TensorFlow's inter-op
// threads, so exchanges waiting for peers never starve the step's other ops.
#include <string>
#include <vector>

#include "mpi/comm.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace {

absl::Status ToTf(const mxrec::mpi::Result& r) {
  switch (r.code) {
    case mxrec::mpi::Code::kOk:
      return absl::OkStatus();
    case mxrec::mpi::Code::kInvalidArgument:
      return absl::InvalidArgumentError(r.message);
    case mxrec::mpi::Code::kDeadlineExceeded:
      return absl::DeadlineExceededError(r.message);
    case mxrec::mpi::Code::kAborted:
      return absl::AbortedError(r.message);
    case mxrec::mpi::Code::kInternal:
      break;
  }
  return absl::InternalError(r.message);
}

template <typename T>
constexpr mxrec::mpi::DType DTypeOf();
template <>
constexpr mxrec::mpi::DType DTypeOf<float>() { return mxrec::mpi::DType::kFloat32; }
template <>
constexpr mxrec::mpi::DType DTypeOf<double>() { return mxrec::mpi::DType::kFloat64; }
template <>
constexpr mxrec::mpi::DType DTypeOf<int32_t>() { return mxrec::mpi::DType::kInt32; }
template <>
constexpr mxrec::mpi::DType DTypeOf<int64_t>() { return mxrec::mpi::DType::kInt64; }

class ExchangeKernel : public AsyncOpKernel {
 public:
  explicit ExchangeKernel(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("channel", &channel_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("exchange", &exchange_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_seconds", &timeout_));
    // NaN fails this too. An infinite timeout waits for ever.
    OP_REQUIRES(ctx, timeout_ > 0,
                absl::InvalidArgumentError("exchange '" + exchange_ +
                                           "': timeout_seconds must be > 0 "
                                           "(MXREC_COLLECTIVE_TIMEOUT), got " +
                                           std::to_string(timeout_)));
  }

 protected:
  int64_t channel_ = 0;
  std::string exchange_;
  float timeout_ = 0;
};

template <typename T>
class AlltoallvOp : public ExchangeKernel {
 public:
  using ExchangeKernel::ExchangeKernel;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    OP_REQUIRES_OK_ASYNC(ctx, ToTf(mxrec::mpi::Initialize()), done);
    const Tensor& data = ctx->input(0);
    const Tensor& counts = ctx->input(1);
    const int size = mxrec::mpi::Size();
    OP_REQUIRES_ASYNC(ctx, data.dims() >= 1,
                      absl::InvalidArgumentError("exchange '" + exchange_ +
                                                 "': data must have rank >= 1"),
                      done);
    OP_REQUIRES_ASYNC(
        ctx, counts.dims() == 1 && counts.dim_size(0) == size,
        absl::InvalidArgumentError("exchange '" + exchange_ + "': send_counts must be [" +
                                   std::to_string(size) + "] (one per rank), got " +
                                   counts.shape().DebugString()),
        done);
    TensorShape row_shape = data.shape();
    row_shape.RemoveDim(0);
    const int64_t row_bytes = row_shape.num_elements() * static_cast<int64_t>(sizeof(T));
    OP_REQUIRES_ASYNC(ctx, row_bytes > 0,
                      absl::InvalidArgumentError("exchange '" + exchange_ +
                                                 "': rows of zero elements cannot be counted "
                                                 "by their bytes; shape " +
                                                 data.shape().DebugString()),
                      done);
    auto c = counts.vec<int32_t>();
    int64_t rows = 0;
    for (int p = 0; p < size; ++p) {
      OP_REQUIRES_ASYNC(ctx, c(p) >= 0,
                        absl::InvalidArgumentError("exchange '" + exchange_ +
                                                   "': negative send count for rank " +
                                                   std::to_string(p)),
                        done);
      rows += c(p);
    }
    OP_REQUIRES_ASYNC(
        ctx, rows == data.dim_size(0),
        absl::InvalidArgumentError("exchange '" + exchange_ + "': send_counts add up to " +
                                   std::to_string(rows) + " rows, data has " +
                                   std::to_string(data.dim_size(0))),
        done);
    // Counts of rows that data holds: their bytes cannot overflow.
    std::vector<int64_t> send_bytes(size);
    for (int p = 0; p < size; ++p) send_bytes[p] = c(p) * row_bytes;
    mxrec::mpi::Schedule([this, ctx, done, data, send_bytes, row_shape, row_bytes, size]() {
      auto allocate = [&](const std::vector<int64_t>& recv_bytes,
                          mxrec::mpi::Result* error) -> char* {
        int64_t total = 0;
        for (int p = 0; p < size; ++p) {
          if (recv_bytes[p] % row_bytes != 0) {
            *error = {mxrec::mpi::Code::kInvalidArgument,
                      "exchange '" + exchange_ + "': rank " + std::to_string(p) + " sent " +
                          std::to_string(recv_bytes[p]) + " bytes, not whole rows of " +
                          std::to_string(row_bytes) + " (the ranks built different models)"};
            return nullptr;
          }
          total += recv_bytes[p] / row_bytes;
        }
        TensorShape out_shape = row_shape;
        out_shape.InsertDim(0, total);
        Tensor* out = nullptr;
        Tensor* recv_counts = nullptr;
        absl::Status s = ctx->allocate_output(0, out_shape, &out);
        if (s.ok()) s = ctx->allocate_output(1, TensorShape({size}), &recv_counts);
        if (!s.ok()) {
          *error = {mxrec::mpi::Code::kInternal, std::string(s.message())};
          return nullptr;
        }
        auto rc = recv_counts->vec<int32_t>();
        for (int p = 0; p < size; ++p) rc(p) = static_cast<int32_t>(recv_bytes[p] / row_bytes);
        // A zero-row output has no buffer; any non-null pointer serves for 0 bytes.
        return total == 0 ? reinterpret_cast<char*>(recv_counts->data())
                          : static_cast<char*>(out->data());
      };
      const char* send = data.NumElements() == 0
                             ? ""
                             : static_cast<const char*>(data.tensor_data().data());
      ctx->SetStatus(ToTf(mxrec::mpi::Alltoallv(channel_, exchange_, send, send_bytes, allocate,
                                                timeout_)));
      done();
    });
  }
};

template <typename T>
class AllreduceOp : public ExchangeKernel {
 public:
  explicit AllreduceOp(OpKernelConstruction* ctx) : ExchangeKernel(ctx) {
    std::string reduction;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("reduction", &reduction));
    reduction_ = reduction == "max"   ? mxrec::mpi::Reduction::kMax
                 : reduction == "min" ? mxrec::mpi::Reduction::kMin
                                      : mxrec::mpi::Reduction::kSum;
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    OP_REQUIRES_OK_ASYNC(ctx, ToTf(mxrec::mpi::Initialize()), done);
    const Tensor& data = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->forward_input_or_allocate_output({0}, 0, data.shape(), &out),
                         done);
    if (out->NumElements() > 0 && out->data() != data.data()) {
      std::copy_n(data.flat<T>().data(), data.NumElements(), out->flat<T>().data());
    }
    mxrec::mpi::Schedule([this, ctx, done, out]() {
      char* buffer = out->NumElements() == 0 ? nullptr : static_cast<char*>(out->data());
      char empty = 0;
      ctx->SetStatus(ToTf(mxrec::mpi::Allreduce(channel_, exchange_,
                                                buffer == nullptr ? &empty : buffer,
                                                out->NumElements(), DTypeOf<T>(), reduction_,
                                                timeout_)));
      done();
    });
  }

 private:
  mxrec::mpi::Reduction reduction_ = mxrec::mpi::Reduction::kSum;
};

class RanksOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, ToTf(mxrec::mpi::Initialize()));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({2}), &out));
    out->vec<int32_t>()(0) = mxrec::mpi::Rank();
    out->vec<int32_t>()(1) = mxrec::mpi::Size();
  }
};

#define REGISTER_MPI(T)                                                                    \
  REGISTER_KERNEL_BUILDER(                                                                 \
      Name("MxrecMpiAlltoallv").Device(DEVICE_CPU).TypeConstraint<T>("T"), AlltoallvOp<T>); \
  REGISTER_KERNEL_BUILDER(                                                                 \
      Name("MxrecMpiAllreduce").Device(DEVICE_CPU).TypeConstraint<T>("T"), AllreduceOp<T>);

REGISTER_MPI(float)
REGISTER_MPI(double)
REGISTER_MPI(int32_t)
REGISTER_MPI(int64_t)
#undef REGISTER_MPI

REGISTER_KERNEL_BUILDER(Name("MxrecMpiRanks").Device(DEVICE_CPU), RanksOp);

}  // namespace
}  // namespace tensorflow
