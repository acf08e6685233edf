// CPU kernels of MxrecPackSend, MxrecSendPositions, MxrecScatterRows and MxrecGatherSumRows
// (see ../ops/send_plan_ops.cc). Each is one pass on one thread: a step runs
// them beside the dense model and the other ranks on the same cores, where the
// composition they replace spent most of its time in a dozen ops' set-up and
// intermediate tensors (int32 gathers, a searchsorted, invert_permutation,
// a serial ScatterNd). Every index is checked before it is used, so a bad plan
// is an InvalidArgument naming the op, the input and the value.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/input_checks.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace mxrec {
namespace {

using tensorflow::OpInputList;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::OpOutputList;
using tensorflow::Tensor;
using tensorflow::TensorShape;

absl::Status Invalid(const OpKernel& kernel, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat(kernel.type_string(), " (", kernel.name(), "): ", what));
}

class SendPositionsOp : public OpKernel {
 public:
  explicit SendPositionsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("group_of", &group_of_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_groups", &num_groups_));
    int n = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n));
    OP_REQUIRES(ctx, static_cast<int>(group_of_.size()) == n,
                Invalid(*this, absl::StrCat("group_of has ", group_of_.size(),
                                            " entries for N = ", n, " lookups")));
    for (int l = 0; l < n; ++l) {
      OP_REQUIRES(ctx, group_of_[l] >= 0 && group_of_[l] < num_groups_,
                  Invalid(*this, absl::StrCat("group_of[", l, "] = ", group_of_[l],
                                              " is not in [0, num_groups = ", num_groups_,
                                              ")")));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList where, order, index;
    OP_REQUIRES_OK(ctx, ctx->input_list("where", &where));
    OP_REQUIRES_OK(ctx, ctx->input_list("order", &order));
    OP_REQUIRES_OK(ctx, ctx->input_list("index", &index));
    const Tensor& width_tensor = ctx->input(3 * where.size());
    const Tensor& offset_tensor = ctx->input(3 * where.size() + 1);
    const int n = where.size();
    OP_REQUIRES(ctx, width_tensor.dims() == 1 && width_tensor.dim_size(0) == n &&
                         offset_tensor.dims() == 1 && offset_tensor.dim_size(0) == n,
                Invalid(*this, absl::StrCat("width and offset must be vectors of the ", n,
                                            " lookups, got shapes ",
                                            width_tensor.shape().DebugString(), " and ",
                                            offset_tensor.shape().DebugString())));
    const int32_t* width = width_tensor.flat<int32_t>().data();
    const int32_t* offset = offset_tensor.flat<int32_t>().data();

    std::vector<int64_t> sizes(num_groups_, 0);
    for (int l = 0; l < n; ++l) {
      OP_REQUIRES(ctx, where[l].dims() == 2 && where[l].dim_size(1) == 2,
                  Invalid(*this, absl::StrCat("where[", l, "] must be [U, 2] (owner, slot), "
                                              "got shape ", where[l].shape().DebugString())));
      OP_REQUIRES(ctx, order[l].dims() == 1 && order[l].dim_size(0) == where[l].dim_size(0),
                  Invalid(*this, absl::StrCat("order[", l, "] must be a vector of the ",
                                              where[l].dim_size(0), " unique IDs, got shape ",
                                              order[l].shape().DebugString())));
      OP_REQUIRES(ctx, index[l].dims() == 1,
                  Invalid(*this, absl::StrCat("index[", l, "] must be a vector, got shape ",
                                              index[l].shape().DebugString())));
      sizes[group_of_[l]] += index[l].dim_size(0);
    }
    OpOutputList outputs;
    OP_REQUIRES_OK(ctx, ctx->output_list("position", &outputs));
    std::vector<int32_t*> out(num_groups_);
    for (int g = 0; g < num_groups_; ++g) {
      Tensor* tensor = nullptr;
      OP_REQUIRES_OK(ctx, outputs.allocate(g, TensorShape({sizes[g]}), &tensor));
      out[g] = tensor->flat<int32_t>().data();
    }
    std::vector<int64_t> by_unique;
    for (int l = 0; l < n; ++l) {
      const int64_t u = where[l].dim_size(0);
      const int32_t* pairs = where[l].flat<int32_t>().data();
      const int32_t* places = order[l].flat<int32_t>().data();
      by_unique.assign(u, -1);
      for (int64_t k = 0; k < u; ++k) {
        const int64_t place = places[k];
        OP_REQUIRES(ctx, place >= 0 && place < u && by_unique[place] < 0,
                    Invalid(*this, absl::StrCat("order[", l, "] is not a permutation of [0, ",
                                                u, "): order[", k, "] = ", place)));
        const int64_t row = static_cast<int64_t>(pairs[2 * k]) * width[l] + offset[l] +
                            pairs[2 * k + 1];
        OP_REQUIRES(ctx, row >= 0 && row <= INT32_MAX,
                    Invalid(*this, absl::StrCat(
                                       "lookup ", l, ": unique ID ", k, " (owner ", pairs[2 * k],
                                       ", slot ", pairs[2 * k + 1], ") with width ", width[l],
                                       " and offset ", offset[l], " has row ", row,
                                       ", outside [0, 2^31 - 1]")));
        by_unique[place] = row;
      }
      const int64_t count = index[l].dim_size(0);
      const int32_t* wanted = index[l].flat<int32_t>().data();
      int32_t*& dest = out[group_of_[l]];
      for (int64_t i = 0; i < count; ++i) {
        const int64_t unique = wanted[i];
        OP_REQUIRES(ctx, unique >= 0 && unique < u,
                    Invalid(*this, absl::StrCat("index[", l, "][", i, "] = ", unique,
                                                " is not in [0, ", u, ") (the unique IDs)")));
        dest[i] = static_cast<int32_t>(by_unique[unique]);
      }
      dest += count;
    }
  }

 private:
  std::vector<int32_t> group_of_;
  int num_groups_ = 1;
};

class PackSendOp : public OpKernel {
 public:
  explicit PackSendOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("size", &size_));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList where, pairs;
    OP_REQUIRES_OK(ctx, ctx->input_list("where", &where));
    OP_REQUIRES_OK(ctx, ctx->input_list("pairs", &pairs));
    const int n = where.size();
    const Tensor& chunks_tensor = ctx->input(2 * n);
    OP_REQUIRES(ctx, chunks_tensor.dims() == 1 && chunks_tensor.dim_size(0) == n,
                Invalid(*this, absl::StrCat("chunks must be a vector of the ", n,
                                            " lookups' columns per peer, got shape ",
                                            chunks_tensor.shape().DebugString())));
    const int32_t* chunks = chunks_tensor.flat<int32_t>().data();
    std::vector<int64_t> offsets(n);
    int64_t total = 0;
    for (int l = 0; l < n; ++l) {
      OP_REQUIRES(ctx, chunks[l] >= 0,
                  Invalid(*this, absl::StrCat("chunks[", l, "] = ", chunks[l], " < 0")));
      offsets[l] = total;
      total += chunks[l];
      OP_REQUIRES(ctx, where[l].dims() == 2 && where[l].dim_size(1) == 2 &&
                           pairs[l].dims() == 2 && pairs[l].dim_size(1) == 2 &&
                           pairs[l].dim_size(0) == where[l].dim_size(0),
                  Invalid(*this, absl::StrCat("where[", l, "] and pairs[", l, "] must be [U, 2] "
                                              "each, got shapes ",
                                              where[l].shape().DebugString(), " and ",
                                              pairs[l].shape().DebugString())));
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateSizedOutput(
                            ctx, 0, "send", {size_, total, 2},
                            absl::StrCat("size = ", size_, " peers, sum(chunks) = ", total), &out));
    int64_t* send = out->flat<int64_t>().data();
    std::fill(send, send + size_ * total * 2, int64_t{0});
    for (int l = 0; l < n; ++l) {
      const int64_t u = where[l].dim_size(0);
      const int32_t* place = where[l].flat<int32_t>().data();
      const int64_t* value = pairs[l].flat<int64_t>().data();
      for (int64_t k = 0; k < u; ++k) {
        const int64_t owner = place[2 * k];
        const int64_t slot = place[2 * k + 1];
        OP_REQUIRES(ctx, owner >= 0 && owner < size_ && slot >= 0 && slot < chunks[l],
                    Invalid(*this, absl::StrCat("where[", l, "][", k, "] = (", owner, ", ", slot,
                                                ") is outside the ", size_, " owners x ",
                                                chunks[l], " columns of lookup ", l)));
        int64_t* cell = send + 2 * (owner * total + offsets[l] + slot);
        cell[0] += value[2 * k];
        cell[1] += value[2 * k + 1];
      }
    }
  }

 private:
  int64_t size_ = 1;
};

// InvalidArgument unless every value of `indices` lies in [0, bound).
absl::Status CheckIndices(const OpKernel& kernel, const char* input, const int32_t* indices,
                          int64_t count, int64_t bound, const char* of) {
  for (int64_t i = 0; i < count; ++i) {
    if (indices[i] < 0 || indices[i] >= bound) {
      return Invalid(kernel, absl::StrCat(input, "[", i, "] = ", indices[i], " is not in [0, ",
                                          bound, ") (", of, ")"));
    }
  }
  return absl::OkStatus();
}

template <typename T>
class ScatterRowsOp : public OpKernel {
 public:
  explicit ScatterRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& emb = ctx->input(0);
    const Tensor& first = ctx->input(1);
    const Tensor& spots = ctx->input(2);
    const Tensor& rows_tensor = ctx->input(3);
    OP_REQUIRES(ctx, emb.dims() == 2 && first.dims() == 1 && spots.dims() == 1 &&
                         first.dim_size(0) == spots.dim_size(0) && rows_tensor.dims() == 0,
                Invalid(*this, absl::StrCat("want emb [M, dim], first [V], spots [V], rows a "
                                            "scalar; got ", emb.shape().DebugString(), ", ",
                                            first.shape().DebugString(), ", ",
                                            spots.shape().DebugString(), ", ",
                                            rows_tensor.shape().DebugString())));
    const int64_t rows = rows_tensor.scalar<int32_t>()();
    OP_REQUIRES(ctx, rows >= 0, Invalid(*this, absl::StrCat("rows = ", rows, " < 0")));
    const int64_t v = first.dim_size(0);
    const int64_t dim = emb.dim_size(1);
    const int32_t* from = first.flat<int32_t>().data();
    const int32_t* to = spots.flat<int32_t>().data();
    OP_REQUIRES_OK(ctx, CheckIndices(*this, "first", from, v, emb.dim_size(0),
                                     "the rows of emb"));
    OP_REQUIRES_OK(ctx, CheckIndices(*this, "spots", to, v, rows, "the rows of the buffer"));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateSizedOutput(ctx, 0, "buffer", {rows, dim},
                                            absl::StrCat("rows = ", rows, ", emb's dim ", dim),
                                            &out));
    T* buffer = out->flat<T>().data();
    const T* source = emb.flat<T>().data();
    std::fill(buffer, buffer + rows * dim, T(0));
    for (int64_t i = 0; i < v; ++i) {
      T* row = buffer + static_cast<int64_t>(to[i]) * dim;
      const T* value = source + static_cast<int64_t>(from[i]) * dim;
      for (int64_t k = 0; k < dim; ++k) row[k] += value[k];
    }
  }
};

template <typename T>
class GatherSumRowsOp : public OpKernel {
 public:
  explicit GatherSumRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scaled", &scaled_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& buffer = ctx->input(0);
    const Tensor& spots = ctx->input(1);
    const Tensor& first = ctx->input(2);
    const Tensor& owned_tensor = ctx->input(3);
    const Tensor& scale_tensor = ctx->input(4);
    OP_REQUIRES(ctx, buffer.dims() == 2 && spots.dims() == 1 && first.dims() == 1 &&
                         spots.dim_size(0) == first.dim_size(0) && owned_tensor.dims() == 0 &&
                         scale_tensor.dims() == 0,
                Invalid(*this, absl::StrCat("want buffer [R, dim], spots [V], first [V], owned "
                                            "and scale scalars; got ",
                                            buffer.shape().DebugString(), ", ",
                                            spots.shape().DebugString(), ", ",
                                            first.shape().DebugString(), ", ",
                                            owned_tensor.shape().DebugString(), ", ",
                                            scale_tensor.shape().DebugString())));
    const int64_t owned = owned_tensor.scalar<int32_t>()();
    OP_REQUIRES(ctx, owned >= 0, Invalid(*this, absl::StrCat("owned = ", owned, " < 0")));
    const int64_t v = spots.dim_size(0);
    const int64_t dim = buffer.dim_size(1);
    const int32_t* from = spots.flat<int32_t>().data();
    const int32_t* to = first.flat<int32_t>().data();
    OP_REQUIRES_OK(ctx, CheckIndices(*this, "spots", from, v, buffer.dim_size(0),
                                     "the rows of the buffer"));
    OP_REQUIRES_OK(ctx, CheckIndices(*this, "first", to, v, owned, "the owned rows"));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateSizedOutput(ctx, 0, "summed", {owned, dim},
                                            absl::StrCat("owned = ", owned, ", buffer's dim ", dim),
                                            &out));
    T* summed = out->flat<T>().data();
    const T* source = buffer.flat<T>().data();
    const T scale = scale_tensor.scalar<T>()();
    std::fill(summed, summed + owned * dim, T(0));
    for (int64_t i = 0; i < v; ++i) {
      T* row = summed + static_cast<int64_t>(to[i]) * dim;
      const T* value = source + static_cast<int64_t>(from[i]) * dim;
      if (scaled_) {
        for (int64_t k = 0; k < dim; ++k) row[k] += value[k] * scale;
      } else {
        for (int64_t k = 0; k < dim; ++k) row[k] += value[k];
      }
    }
  }

 private:
  bool scaled_ = false;
};

REGISTER_KERNEL_BUILDER(Name("MxrecPackSend").Device(tensorflow::DEVICE_CPU), PackSendOp);
REGISTER_KERNEL_BUILDER(Name("MxrecSendPositions").Device(tensorflow::DEVICE_CPU),
                        SendPositionsOp);
#define MXREC_REGISTER_SEND_PLAN(T)                                                   \
  REGISTER_KERNEL_BUILDER(                                                            \
      Name("MxrecScatterRows").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      ScatterRowsOp<T>);                                                              \
  REGISTER_KERNEL_BUILDER(                                                            \
      Name("MxrecGatherSumRows").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      GatherSumRowsOp<T>);
MXREC_REGISTER_SEND_PLAN(float)
MXREC_REGISTER_SEND_PLAN(double)
#undef MXREC_REGISTER_SEND_PLAN

}  // namespace
}  // namespace mxrec
