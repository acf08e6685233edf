// CPU kernel of MxrecExchangeReceived (see ../ops/exchange_received_ops.cc).
//
// A counting sort of the filled slots by lookup: one pass counts them per
// lookup, one pass places them. Both scan the slots in slot order, which is
// peer-then-column order, so each lookup's rows come out in that order (the
// stable argsort the TF composition computes) without a sort. One thread: the
// slots of a step are a few tens of thousands of pairs.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace mxrec {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// The int32 outputs (peer, valid) and the reference's int32 slot numbers
// number at most this many slots.
constexpr int64_t kMaxSlots = INT32_MAX;

class ExchangeReceivedOp : public OpKernel {
 public:
  explicit ExchangeReceivedOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("size", &size_));
    OP_REQUIRES(ctx, size_ <= INT32_MAX,
                Invalid(absl::StrCat("size = ", size_, " ranks is more than the ", INT32_MAX,
                                     " an int32 peer can name")));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& received_tensor = ctx->input(0);
    const Tensor& chunks_tensor = ctx->input(1);
    OP_REQUIRES(ctx, received_tensor.dims() == 2 && received_tensor.dim_size(1) == 2,
                Invalid(absl::StrCat("received must be [R, 2] (ID, occurrences), got shape ",
                                     received_tensor.shape().DebugString())));
    OP_REQUIRES(ctx, chunks_tensor.dims() == 1,
                Invalid(absl::StrCat("chunks must be a vector (columns per peer of each "
                                     "lookup), got shape ",
                                     chunks_tensor.shape().DebugString())));
    const int64_t r = received_tensor.dim_size(0);
    const int64_t l = chunks_tensor.dim_size(0);
    const int32_t* chunks = chunks_tensor.flat<int32_t>().data();

    // Each lookup's first column per peer, and the lookup of each column.
    int64_t total = 0;
    std::vector<int64_t> offsets(l);
    for (int64_t j = 0; j < l; ++j) {
      OP_REQUIRES(ctx, chunks[j] >= 0,
                  Invalid(absl::StrCat("chunks[", j, "] = ", chunks[j],
                                       " is negative; a lookup has 0 or more columns per "
                                       "peer")));
      offsets[j] = total;
      total += chunks[j];
      OP_REQUIRES(ctx, total <= kMaxSlots,
                  Invalid(absl::StrCat("the sum of chunks exceeds ", kMaxSlots,
                                       " columns per peer")));
    }
    OP_REQUIRES(ctx, total * size_ == r,
                Invalid(absl::StrCat("received has ", r, " slots but size * sum(chunks) = ",
                                     size_, " * ", total, " = ", total * size_,
                                     "; received must be [size * sum(chunks), 2]")));
    OP_REQUIRES(ctx, r <= kMaxSlots,
                Invalid(absl::StrCat("received has ", r, " slots, more than the ", kMaxSlots,
                                     " its int32 outputs can number")));
    std::vector<int32_t> column_lookup(total);
    for (int64_t j = 0; j < l; ++j) {
      for (int64_t c = offsets[j]; c < offsets[j] + chunks[j]; ++c) {
        column_lookup[c] = static_cast<int32_t>(j);
      }
    }

    const int64_t* received = received_tensor.flat<int64_t>().data();
    Tensor* per_lookup_tensor = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({l}), &per_lookup_tensor));
    int32_t* per_lookup = per_lookup_tensor->flat<int32_t>().data();
    std::fill(per_lookup, per_lookup + l, 0);
    int64_t v = 0;
    for (int64_t s = 0, column = 0; s < r; ++s) {
      const int64_t occurrences = received[2 * s + 1];
      OP_REQUIRES(ctx, occurrences >= 0,
                  Invalid(absl::StrCat("slot ", s, " (peer ", s / total, ", column ",
                                       s % total, ") has ", occurrences,
                                       " occurrences; a count must be >= 0 (0: an empty "
                                       "slot)")));
      if (occurrences > 0) {
        ++per_lookup[column_lookup[column]];
        ++v;
      }
      if (++column == total) column = 0;
    }
    // Each lookup's next free row.
    std::vector<int64_t> next(l);
    for (int64_t j = 0, row = 0; j < l; ++j) {
      next[j] = row;
      row += per_lookup[j];
    }

    Tensor* pairs_tensor = nullptr;
    Tensor* lookup_tensor = nullptr;
    Tensor* peer_tensor = nullptr;
    Tensor* valid_tensor = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({v, 2}), &pairs_tensor));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({v}), &lookup_tensor));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({v}), &peer_tensor));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({v}), &valid_tensor));
    int64_t* pairs = pairs_tensor->flat<int64_t>().data();
    int32_t* lookup = lookup_tensor->flat<int32_t>().data();
    int32_t* peer = peer_tensor->flat<int32_t>().data();
    int32_t* valid = valid_tensor->flat<int32_t>().data();
    for (int64_t s = 0, p = 0, column = 0; s < r; ++s) {
      if (received[2 * s + 1] > 0) {
        const int32_t j = column_lookup[column];
        const int64_t row = next[j]++;
        pairs[2 * row] = received[2 * s];
        pairs[2 * row + 1] = received[2 * s + 1];
        lookup[row] = j;
        peer[row] = static_cast<int32_t>(p);
        valid[row] = static_cast<int32_t>(p * chunks[j] + column - offsets[j]);
      }
      if (++column == total) {
        column = 0;
        ++p;
      }
    }
  }

 private:
  absl::Status Invalid(const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(type_string(), " (", name(), "): ", what));
  }

  int64_t size_ = 1;
};

REGISTER_KERNEL_BUILDER(Name("MxrecExchangeReceived").Device(tensorflow::DEVICE_CPU),
                        ExchangeReceivedOp);

}  // namespace
}  // namespace mxrec
