// CPU kernel of MxrecRoute (see ../ops/route_ops.cc).
//
// One pass numbers the unique IDs in first-occurrence order and counts their
// occurrences, through an open-addressing table (linear probing, a power of two
// of at least 2n slots, so at most half full); then a counting sort by owner
// places each unique ID in its owner's bucket, in first-occurrence order
// within an owner (the stable argsort the TF composition computes). One thread:
// 53k power-law IDs take about 0.5 ms, and a step runs many lookups' routes at
// once.
#include <algorithm>
#include <cstdint>
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

// The int32 outputs (index, order, slots) number at most this many IDs.
constexpr int64_t kMaxIds = INT32_MAX;
// Ranks a route spreads IDs over at most: each call keeps three arrays of one
// entry per rank (far more ranks than any job has, far less memory than a host).
constexpr int64_t kMaxRanks = int64_t{1} << 20;
// owner_of's multiplier and shift (mxrec/distributed/routing.py).
constexpr uint64_t kOwnerMultiplier = 0x9E3779B97F4A7C15ULL;
constexpr int kOwnerShift = 33;

// SplitMix64's finalizer. The table's slot is taken from its low bits: a full
// mix, so that IDs of one stride or one owner (the owner is a function of the
// same ID) do not crowd into runs of neighbouring slots.
inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

struct Slot {
  int64_t key;
  int32_t unique;  // the ID's first-occurrence number; -1: an empty slot
};

class RouteOp : public OpKernel {
 public:
  explicit RouteOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t size = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("size", &size));
    OP_REQUIRES(ctx, size <= kMaxRanks,
                absl::InvalidArgumentError(absl::StrCat(
                    type_string(), " (", name(), "): size = ", size,
                    " ranks is more than the ", kMaxRanks, " a route supports")));
    size_ = static_cast<uint32_t>(size);
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids_tensor = ctx->input(0);
    const int64_t n = ids_tensor.NumElements();
    OP_REQUIRES(ctx, n <= kMaxIds,
                absl::InvalidArgumentError(absl::StrCat(
                    type_string(), " (", name(), "): ids has ", n, " values, more than the ",
                    kMaxIds, " its int32 outputs (index, order, where) can number; route "
                    "the batch in parts")));
    const int64_t* ids = ids_tensor.flat<int64_t>().data();
    Tensor* index_tensor = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({n}), &index_tensor));
    int32_t* index = index_tensor->flat<int32_t>().data();

    std::vector<int64_t> unique;
    std::vector<int64_t> occurrences;
    Number(ids, n, index, &unique, &occurrences);
    const int64_t u = static_cast<int64_t>(unique.size());

    Tensor* counts_tensor = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({size_}), &counts_tensor));
    int32_t* counts = counts_tensor->flat<int32_t>().data();
    std::fill(counts, counts + size_, 0);
    std::vector<int32_t> owner(u);
    for (int64_t j = 0; j < u; ++j) {
      const uint64_t mixed = static_cast<uint64_t>(unique[j]) * kOwnerMultiplier;
      owner[j] = static_cast<int32_t>(static_cast<uint32_t>(mixed >> kOwnerShift) % size_);
      ++counts[owner[j]];
    }
    // Each owner's first row in the sorted output, and the next free one.
    std::vector<int32_t> start(size_);
    std::vector<int32_t> next(size_);
    int32_t row = 0;
    for (uint32_t o = 0; o < size_; ++o) {
      start[o] = next[o] = row;
      row += counts[o];
    }

    Tensor* pairs_tensor = nullptr;
    Tensor* where_tensor = nullptr;
    Tensor* order_tensor = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u, 2}), &pairs_tensor));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({u, 2}), &where_tensor));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({u}), &order_tensor));
    int64_t* pairs = pairs_tensor->flat<int64_t>().data();
    int32_t* where = where_tensor->flat<int32_t>().data();
    int32_t* order = order_tensor->flat<int32_t>().data();
    for (int64_t j = 0; j < u; ++j) {
      const int32_t o = owner[j];
      const int32_t r = next[o]++;
      pairs[2 * r] = unique[j];
      pairs[2 * r + 1] = occurrences[j];
      where[2 * r] = o;
      where[2 * r + 1] = r - start[o];
      order[r] = static_cast<int32_t>(j);
    }
  }

 private:
  // index[i] = the first-occurrence number of ids[i]; unique and occurrences
  // get each unique ID and its count, in that numbering.
  static void Number(const int64_t* ids, int64_t n, int32_t* index, std::vector<int64_t>* unique,
                     std::vector<int64_t>* occurrences) {
    if (n == 0) return;
    uint64_t capacity = 2;
    while (capacity < 2 * static_cast<uint64_t>(n)) capacity <<= 1;
    const uint64_t mask = capacity - 1;
    std::vector<Slot> table(capacity, Slot{0, -1});
    unique->reserve(n);
    occurrences->reserve(n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t key = ids[i];
      uint64_t s = Mix(static_cast<uint64_t>(key)) & mask;
      while (table[s].unique >= 0 && table[s].key != key) s = (s + 1) & mask;
      Slot& slot = table[s];
      if (slot.unique < 0) {
        slot.key = key;
        slot.unique = static_cast<int32_t>(unique->size());
        unique->push_back(key);
        occurrences->push_back(0);
      }
      ++(*occurrences)[slot.unique];
      index[i] = slot.unique;
    }
  }

  uint32_t size_ = 1;
};

REGISTER_KERNEL_BUILDER(Name("MxrecRoute").Device(tensorflow::DEVICE_CPU), RouteOp);

}  // namespace
}  // namespace mxrec
