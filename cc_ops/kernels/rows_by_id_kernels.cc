// CPU kernel of MxrecRowsById (see ../ops/rows_by_id_ops.cc).
//
// Each ID has its own stream of 64-bit draws, SplitMix64 over a counter that
// starts at Mix(Mix(seed) ^ Mix(id)); a row's values take the stream's draws
// in column order. Normal values come from Box-Muller on two draws (one value
// per pair, so no state is carried between values); truncated normal values
// redraw until |z| <= 2. The values depend only on (seed, id, dim, the
// distribution and its parameters), never on threads or on the other IDs.
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
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
    const double u1 = Uniform();
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

enum class Distribution { kNormal, kTruncatedNormal, kUniform };

class RowsByIdOp : public OpKernel {
 public:
  explicit RowsByIdOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
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

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    OP_REQUIRES(ctx, ids.dims() == 1,
                absl::InvalidArgumentError("MxrecRowsById: ids must be a vector"));
    const int64_t n = ids.dim_size(0);
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim_}), &rows));
    const int64_t* id = ids.flat<int64_t>().data();
    float* out = rows->flat<float>().data();
    auto fill = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        Stream stream(seed_, static_cast<uint64_t>(id[i]));
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

REGISTER_KERNEL_BUILDER(Name("MxrecRowsById").Device(tensorflow::DEVICE_CPU), RowsByIdOp);

}  // namespace
}  // namespace mxrec
