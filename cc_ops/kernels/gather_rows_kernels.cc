// CPU kernels of MxrecGatherRows and MxrecGatherRowsGrad (see
// ../ops/gather_rows_ops.cc). Both check every restore value first, so a bad
// plan is an InvalidArgument naming the op, the position and the value, never
// a read or write past a buffer. The copies and sums run over TensorFlow's
// intra-op pool (tensorflow::Shard).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/input_checks.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/util/work_sharder.h"

namespace mxrec {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

// Below this many values (positions x dim) a kernel runs on its own thread: a
// step runs many lookups at once, and shards of small copies cost more than
// they save. Above it the forward copies rows in shards, and the gradient sorts
// the positions by row (stable, so each row's sum keeps position order) and
// sums the rows in shards.
constexpr int64_t kParallelValues = int64_t{1} << 18;

// InvalidArgument unless restore is a vector whose every value lies in
// [0, num_unique].
template <typename Index>
absl::Status CheckRestore(const OpKernel& kernel, const Tensor& restore, int64_t num_unique) {
  if (restore.dims() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        kernel.type_string(), " (", kernel.name(), "): restore must be a vector, got shape ",
        restore.shape().DebugString()));
  }
  const auto values = restore.flat<Index>();
  const int64_t n = values.size();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = static_cast<int64_t>(values(i));
    if (row < 0 || row > num_unique) {
      return absl::InvalidArgumentError(absl::StrCat(
          kernel.type_string(), " (", kernel.name(), "): restore[", i, "] = ", row,
          " is not in [0, ", num_unique, "] (", num_unique,
          " unique rows; the value ", num_unique, " means the default row)"));
    }
  }
  return absl::OkStatus();
}

template <typename T, typename Index>
class GatherRowsOp : public OpKernel {
 public:
  explicit GatherRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& unique_emb = ctx->input(0);
    const Tensor& restore = ctx->input(1);
    const Tensor& default_row = ctx->input(2);
    OP_REQUIRES(ctx, unique_emb.dims() == 2,
                absl::InvalidArgumentError(absl::StrCat(
                    type_string(), " (", name(), "): unique_emb must be a matrix, got shape ",
                    unique_emb.shape().DebugString())));
    const int64_t num_unique = unique_emb.dim_size(0);
    const int64_t dim = unique_emb.dim_size(1);
    OP_REQUIRES(ctx, default_row.dims() == 1 && default_row.dim_size(0) == dim,
                absl::InvalidArgumentError(absl::StrCat(
                    type_string(), " (", name(), "): default_row must be a vector of ", dim,
                    " values (unique_emb's dimension 1), got shape ",
                    default_row.shape().DebugString())));
    OP_REQUIRES_OK(ctx, CheckRestore<Index>(*this, restore, num_unique));
    const int64_t n = restore.dim_size(0);
    Tensor* emb = nullptr;
    OP_REQUIRES_OK(ctx, AllocateSizedOutput(ctx, 0, "emb", {n, dim},
                                            absl::StrCat("restore's ", n, " positions, dim ", dim),
                                            &emb));
    if (n == 0 || dim == 0) return;

    const T* source = unique_emb.flat<T>().data();
    const T* fallback = default_row.flat<T>().data();
    const Index* rows = restore.flat<Index>().data();
    T* out = emb->flat<T>().data();
    const size_t row_bytes = static_cast<size_t>(dim) * sizeof(T);
    auto copy = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t row = static_cast<int64_t>(rows[i]);
        const T* from = row == num_unique ? fallback : source + row * dim;
        std::memcpy(out + i * dim, from, row_bytes);
      }
    };
    if (n * dim < kParallelValues) {
      copy(0, n);
      return;
    }
    // Cost per position: one row read and one written.
    const auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
    tensorflow::Shard(threads->num_threads, threads->workers, n,
                      static_cast<int64_t>(2 * row_bytes), copy);
  }
};

template <typename T, typename Index>
class GatherRowsGradOp : public OpKernel {
 public:
  explicit GatherRowsGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(0);
    const Tensor& restore = ctx->input(1);
    const Tensor& num_unique_tensor = ctx->input(2);
    OP_REQUIRES(ctx, num_unique_tensor.dims() == 0,
                absl::InvalidArgumentError(absl::StrCat(
                    type_string(), " (", name(), "): num_unique must be a scalar, got shape ",
                    num_unique_tensor.shape().DebugString())));
    const int64_t num_unique = static_cast<int64_t>(num_unique_tensor.scalar<Index>()());
    OP_REQUIRES(ctx, num_unique >= 0,
                absl::InvalidArgumentError(absl::StrCat(
                    type_string(), " (", name(), "): num_unique must be >= 0, got ",
                    num_unique)));
    OP_REQUIRES(ctx, grad.dims() == 2,
                absl::InvalidArgumentError(absl::StrCat(
                    type_string(), " (", name(), "): grad must be a matrix, got shape ",
                    grad.shape().DebugString())));
    OP_REQUIRES_OK(ctx, CheckRestore<Index>(*this, restore, num_unique));
    const int64_t n = restore.dim_size(0);
    OP_REQUIRES(ctx, grad.dim_size(0) == n,
                absl::InvalidArgumentError(absl::StrCat(
                    type_string(), " (", name(), "): grad has ", grad.dim_size(0),
                    " rows but restore ", n, " positions")));
    const int64_t dim = grad.dim_size(1);
    Tensor* unique_grad = nullptr;
    OP_REQUIRES_OK(ctx, AllocateSizedOutput(
                            ctx, 0, "unique_grad", {num_unique, dim},
                            absl::StrCat("num_unique = ", num_unique, ", grad's dim ", dim),
                            &unique_grad));
    T* out = unique_grad->flat<T>().data();
    const int64_t out_size = num_unique * dim;
    if (out_size == 0) return;
    const T* in = grad.flat<T>().data();
    const Index* rows = restore.flat<Index>().data();

    // Each row's sum starts from zero and adds its positions in increasing
    // order, as unsorted_segment_sum does, so the floats are the same.
    if (n * dim < kParallelValues) {
      std::memset(out, 0, static_cast<size_t>(out_size) * sizeof(T));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t row = static_cast<int64_t>(rows[i]);
        if (row == num_unique) continue;
        T* to = out + row * dim;
        const T* from = in + i * dim;
        for (int64_t k = 0; k < dim; ++k) to[k] += from[k];
      }
      return;
    }
    // Counting sort of the positions by row: starts[j] .. starts[j + 1] are
    // row j's positions in increasing order.
    std::vector<int64_t> starts(num_unique + 2, 0);
    for (int64_t i = 0; i < n; ++i) ++starts[static_cast<int64_t>(rows[i]) + 1];
    for (int64_t j = 0; j <= num_unique; ++j) starts[j + 1] += starts[j];
    std::vector<int64_t> next(starts.begin(), starts.end() - 1);
    std::vector<int64_t> order(static_cast<size_t>(starts[num_unique]));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = static_cast<int64_t>(rows[i]);
      if (row != num_unique) order[next[row]++] = i;
    }
    auto sum_rows = [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        T* to = out + j * dim;
        std::fill(to, to + dim, T(0));
        for (int64_t p = starts[j]; p < starts[j + 1]; ++p) {
          const T* from = in + order[p] * dim;
          for (int64_t k = 0; k < dim; ++k) to[k] += from[k];
        }
      }
    };
    const int64_t per_row = std::max<int64_t>(1, n / num_unique);
    const auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
    tensorflow::Shard(threads->num_threads, threads->workers, num_unique,
                      static_cast<int64_t>(3 * per_row * dim * sizeof(T)), sum_rows);
  }
};

#define MXREC_REGISTER_GATHER_ROWS(T, Index)                                      \
  REGISTER_KERNEL_BUILDER(Name("MxrecGatherRows")                                 \
                              .Device(tensorflow::DEVICE_CPU)                     \
                              .TypeConstraint<T>("T")                             \
                              .TypeConstraint<Index>("Tindices"),                 \
                          GatherRowsOp<T, Index>);                                \
  REGISTER_KERNEL_BUILDER(Name("MxrecGatherRowsGrad")                             \
                              .Device(tensorflow::DEVICE_CPU)                     \
                              .TypeConstraint<T>("T")                             \
                              .TypeConstraint<Index>("Tindices"),                 \
                          GatherRowsGradOp<T, Index>);

MXREC_REGISTER_GATHER_ROWS(float, int32_t)
MXREC_REGISTER_GATHER_ROWS(float, int64_t)
MXREC_REGISTER_GATHER_ROWS(double, int32_t)
MXREC_REGISTER_GATHER_ROWS(double, int64_t)

#undef MXREC_REGISTER_GATHER_ROWS

}  // namespace
}  // namespace mxrec
