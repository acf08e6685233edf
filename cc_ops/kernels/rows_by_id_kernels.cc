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
using tensorflow::TensorShape;

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
  // rows [n, dim] of the IDs key(i), i < n, as the output.
  template <typename Key>
  void Fill(OpKernelContext* ctx, int64_t n, const Key& key) {
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim_}), &rows));
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
                absl::InvalidArgumentError("MxrecRowsById: ids must be a vector"));
    const int64_t* id = ids.flat<int64_t>().data();
    Fill(ctx, ids.dim_size(0), [id](int64_t i) { return id[i]; });
  }
};

// The plan's rows -> their IDs in one pass: the first position of each unique row
// (restore), then each wanted row's index among the unique rows (sorted pairs).
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
    const Tids* id = ids.flat<Tids>().data();
    const int32_t* where = restore.flat<int32_t>().data();
    std::vector<int64_t> first(u, -1);
    for (int64_t p = n - 1; p >= 0; --p) {
      const int32_t r = where[p];
      if (r >= 0 && r < u) first[r] = p;
    }
    const int32_t* rows = unique_rows.flat<int32_t>().data();
    std::vector<std::pair<int32_t, int32_t>> by_row(u);
    for (int64_t i = 0; i < u; ++i) by_row[i] = {rows[i], static_cast<int32_t>(i)};
    std::sort(by_row.begin(), by_row.end());
    const int64_t r = wanted.dim_size(0);
    const int32_t* want = wanted.flat<int32_t>().data();
    std::vector<int64_t> keys(r);
    for (int64_t k = 0; k < r; ++k) {
      auto it = std::lower_bound(by_row.begin(), by_row.end(),
                                 std::make_pair(want[k], std::numeric_limits<int32_t>::min()));
      OP_REQUIRES(ctx, it != by_row.end() && it->first == want[k] && first[it->second] >= 0,
                  absl::InvalidArgumentError(absl::StrCat(
                      "MxrecPlanRowsById: wanted row ", want[k],
                      " is not a row of the plan's IDs")));
      keys[k] = static_cast<int64_t>(id[first[it->second]]);
    }
    Fill(ctx, r, [&keys](int64_t i) { return keys[i]; });
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
