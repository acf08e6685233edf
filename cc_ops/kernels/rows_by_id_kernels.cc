// CPU kernel of MxrecRowsById (see ../ops/rows_by_id_ops.cc).
//
// Each ID has its own stream of 64-bit draws, SplitMix64 over a counter that
// starts at Mix(Mix(seed) ^ Mix(id)); a row's values take the stream's draws
// in column order. Normal values come in pairs from Marsaglia's polar method
// (two draws in the unit disc, one log and one square root for two values; the
// second value of a pair is the row's next normal value); truncated normal
// values skip every |z| > 2. The values depend only on (seed, id, dim, the
// distribution and its parameters), never on threads or on the other IDs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
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

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// One ID's stream: uniform doubles in (0, 1), 53 bits each.
class Stream {
 public:
  Stream(uint64_t seed, uint64_t id) : state_(Mix(Mix(seed + kGolden) ^ Mix(id + 2 * kGolden))) {}
  double Uniform() {
    state_ += kGolden;
    return (static_cast<double>(Mix(state_) >> 11) + 0.5) * 0x1.0p-53;
  }
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = 2.0 * Uniform() - 1.0;
      v = 2.0 * Uniform() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double m = std::sqrt(-2.0 * std::log(s) / s);
    spare_ = v * m;
    has_spare_ = true;
    return u * m;
  }

 private:
  uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

enum class Distribution { kNormal, kTruncatedNormal, kUniform };

// The attributes and the draw both ops share.
class RowsByIdBase : public OpKernel {
 public:
  explicit RowsByIdBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t seed = 0;
    std::string distribution;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &seed));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("distribution", &distribution));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("a", &a_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("b", &b_));
    // Rows drawn with a bound that is not finite would be NaN or infinite.
    OP_REQUIRES(ctx, std::isfinite(a_) && std::isfinite(b_),
                absl::InvalidArgumentError(absl::StrCat(
                    type_string(), " (", name(), "): the ", distribution,
                    " distribution's parameters a = ", a_, " and b = ", b_,
                    " must be finite")));
    seed_ = static_cast<uint64_t>(seed);
    if (distribution == "normal") {
      distribution_ = Distribution::kNormal;
    } else if (distribution == "truncated_normal") {
      distribution_ = Distribution::kTruncatedNormal;
    } else {
      distribution_ = Distribution::kUniform;
    }
  }

 protected:
  // rows [n, dim] of the IDs key(i), i < n, as the output (`what`: the n IDs).
  template <typename Key>
  void Fill(OpKernelContext* ctx, int64_t n, const char* what, const Key& key) {
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, AllocateSizedOutput(ctx, 0, "rows", {n, dim_},
                                            absl::StrCat(n, " ", what, ", dim = ", dim_), &rows));
    if (rows->NumElements() == 0) return;
    float* out = rows->flat<float>().data();
    auto fill = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        Stream stream(seed_, static_cast<uint64_t>(key(i)));
        float* row = out + i * dim_;
        for (int64_t j = 0; j < dim_; ++j) row[j] = static_cast<float>(Draw(stream));
      }
    };
    const auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
    tensorflow::Shard(threads->num_threads, threads->workers, n, 40 * dim_, fill);
  }

 private:
  double Draw(Stream& stream) const {
    switch (distribution_) {
      case Distribution::kNormal:
        return a_ + b_ * stream.Normal();
      case Distribution::kTruncatedNormal: {
        double z = stream.Normal();
        while (std::fabs(z) > 2.0) z = stream.Normal();
        return a_ + b_ * z;
      }
      case Distribution::kUniform:
        break;
    }
    return a_ + (b_ - a_) * stream.Uniform();
  }

  int64_t dim_ = 1;
  uint64_t seed_ = 0;
  float a_ = 0.0f;
  float b_ = 1.0f;
  Distribution distribution_ = Distribution::kNormal;
};

class RowsByIdOp : public RowsByIdBase {
 public:
  using RowsByIdBase::RowsByIdBase;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    OP_REQUIRES(ctx, ids.dims() == 1,
                absl::InvalidArgumentError(absl::StrCat("MxrecRowsById: ids must be a vector, got shape ",
                                                        ids.shape().DebugString())));
    const int64_t* id = ids.flat<int64_t>().data();
    Fill(ctx, ids.dim_size(0), "ids", [id](int64_t i) { return id[i]; });
  }
};

// Rows -> a small int (the first slot given each row): open addressing, linear probing,
// a power-of-two table at least twice the rows.
class RowSlots {
 public:
  explicit RowSlots(int64_t count) {
    int64_t capacity = 16;
    while (capacity < 2 * count) capacity <<= 1;
    mask_ = static_cast<uint64_t>(capacity - 1);
    rows_.assign(capacity, 0);
    slots_.assign(capacity, -1);
  }
  // The slot of `row`; `slot` if `row` is new.
  int32_t Insert(int32_t row, int32_t slot) {
    uint64_t at = Start(row);
    while (slots_[at] >= 0) {
      if (rows_[at] == row) return slots_[at];
      at = (at + 1) & mask_;
    }
    rows_[at] = row;
    slots_[at] = slot;
    return slot;
  }
  // The slot of `row`, -1 if absent.
  int32_t Find(int32_t row) const {
    uint64_t at = Start(row);
    while (slots_[at] >= 0) {
      if (rows_[at] == row) return slots_[at];
      at = (at + 1) & mask_;
    }
    return -1;
  }

 private:
  uint64_t Start(int32_t row) const {
    return ((static_cast<uint64_t>(static_cast<uint32_t>(row)) * kGolden) >> 32) & mask_;
  }
  uint64_t mask_ = 0;
  std::vector<int32_t> rows_;
  std::vector<int32_t> slots_;
};

// The plan's rows -> their IDs in two linear passes, no sort: each wanted row's slot
// (a hash map of the wanted rows, few in a steady stream: only rows handed to new IDs),
// marked on the first unique row that holds it; then the first position in `restore`
// of each marked unique row gives the ID. O(N + U + R) where a sort of the U unique
// rows cost 1.8 % of a streaming rank's time.
template <typename Tids>
class PlanRowsByIdOp : public RowsByIdBase {
 public:
  using RowsByIdBase::RowsByIdBase;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    const Tensor& unique_rows = ctx->input(1);
    const Tensor& restore = ctx->input(2);
    const Tensor& wanted = ctx->input(3);
    OP_REQUIRES(ctx, unique_rows.dims() == 1 && wanted.dims() == 1 &&
                         ids.NumElements() == restore.NumElements(),
                absl::InvalidArgumentError(absl::StrCat(
                    "MxrecPlanRowsById: unique_rows and wanted_rows must be vectors and ids "
                    "as many as restore, got ", ids.NumElements(), " ids and ",
                    restore.NumElements(), " restore values")));
    const int64_t u = unique_rows.dim_size(0);
    const int64_t n = ids.NumElements();
    const int64_t r = wanted.dim_size(0);
    const Tids* id = ids.flat<Tids>().data();
    const int32_t* where = restore.flat<int32_t>().data();
    const int32_t* rows = unique_rows.flat<int32_t>().data();
    const int32_t* want = wanted.flat<int32_t>().data();
    // wanted row -> its first index k among the wanted rows
    RowSlots slot_of(r);
    std::vector<int32_t> first_slot(r);
    for (int64_t k = 0; k < r; ++k) {
      first_slot[k] = slot_of.Insert(want[k], static_cast<int32_t>(k));
    }
    // unique row i -> the wanted slot it fills (-1: none); the first i holding a row wins
    std::vector<int32_t> slot(u, -1);
    std::vector<uint8_t> taken(r, 0);
    int64_t marked = 0;
    for (int64_t i = 0; i < u && marked < r; ++i) {
      const int32_t k = slot_of.Find(rows[i]);
      if (k < 0 || taken[k]) continue;
      taken[k] = 1;
      slot[i] = k;
      ++marked;
    }
    std::vector<int64_t> keys(r, 0);
    std::vector<uint8_t> found(r, 0);
    for (int64_t p = 0; p < n; ++p) {
      const int32_t w = where[p];
      if (w < 0 || w >= u || slot[w] < 0 || found[slot[w]]) continue;
      found[slot[w]] = 1;
      keys[slot[w]] = static_cast<int64_t>(id[p]);
    }
    for (int64_t k = 0; k < r; ++k) {
      const int32_t first = first_slot[k];  // a repeated wanted row: its first slot
      OP_REQUIRES(ctx, found[first],
                  absl::InvalidArgumentError(absl::StrCat(
                      "MxrecPlanRowsById: wanted row ", want[k],
                      " is not a row of the plan's IDs")));
      keys[k] = keys[first];
    }
    Fill(ctx, r, "wanted rows", [&keys](int64_t i) { return keys[i]; });
  }
};

REGISTER_KERNEL_BUILDER(Name("MxrecRowsById").Device(tensorflow::DEVICE_CPU), RowsByIdOp);
REGISTER_KERNEL_BUILDER(
    Name("MxrecPlanRowsById").Device(tensorflow::DEVICE_CPU).TypeConstraint<int32_t>("Tids"),
    PlanRowsByIdOp<int32_t>);
REGISTER_KERNEL_BUILDER(
    Name("MxrecPlanRowsById").Device(tensorflow::DEVICE_CPU).TypeConstraint<int64_t>("Tids"),
    PlanRowsByIdOp<int64_t>);

}  // namespace
}  // namespace mxrec
