// Kernels of MxrecTierSwap / MxrecTierRead: adapters from tensors to HostTier.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/registry.h"
#include "kernels/input_checks.h"
#include "kernels/status_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

namespace tensorflow {
namespace {

class TierOpBase : public OpKernel {
 public:
  explicit TierOpBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string key;
    std::string component;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_key", &key));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("component", &component));
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(mxrec::Registry::Global().GetTable(key, &table_)));
    OP_REQUIRES(ctx, table_->tiered(),
                absl::InvalidArgumentError(absl::StrCat(
                    "mxrec table '", table_->options().name,
                    "' has no host tier (host_vocabulary_size is 0)")));
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(table_->tier()->RegisterComponent(component,
                                                                            &component_)));
  }

 protected:
  std::shared_ptr<mxrec::HostTable> table_;
  int component_ = 0;
};

// Fills the rows of new IDs (fresh[i]) of `out` (n x dim) from fresh_values:
// a scalar (a slot's initial value) or n x dim (the initializer's rows).
void FillFresh(const Tensor& fresh_values, const bool* fresh, int64_t n, int64_t dim,
               const std::function<float*(int64_t)>& out) {
  if (fresh_values.dims() == 0) {
    const float value = fresh_values.scalar<float>()();
    for (int64_t i = 0; i < n; ++i) {
      if (fresh[i]) std::fill(out(i), out(i) + dim, value);
    }
  } else {
    const float* init = fresh_values.flat<float>().data();
    for (int64_t i = 0; i < n; ++i) {
      if (fresh[i]) std::memcpy(out(i), init + i * dim, dim * sizeof(float));
    }
  }
}

absl::Status CheckFresh(const std::string& table, const Tensor& fresh_values, int64_t n,
                        int64_t dim) {
  if (fresh_values.dims() == 0 || (fresh_values.dims() == 2 && fresh_values.dim_size(0) == n &&
                                   fresh_values.dim_size(1) == dim)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "swap on table '", table, "': fresh_values must be a scalar or [", n, ", ", dim,
      "], got ", fresh_values.shape().DebugString()));
}

class MxrecTierSwapOp : public TierOpBase {
 public:
  using TierOpBase::TierOpBase;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(0);
    const Tensor& current = ctx->input(1);
    const Tensor& fresh_values = ctx->input(2);
    const int64_t dim = table_->options().dim;
    OP_REQUIRES_OK(ctx, mxrec::CheckInputRank(*this, table_->options().name, "rows", rows, 1));
    const int64_t n = rows.NumElements();
    OP_REQUIRES(ctx, current.dims() == 2 && current.dim_size(0) == n && current.dim_size(1) == dim,
                absl::InvalidArgumentError(absl::StrCat(
                    "MxrecTierSwap on table '", table_->options().name, "': current must be [",
                    n, ", ", dim, "], got ", current.shape().DebugString())));
    OP_REQUIRES_OK(ctx, CheckFresh(table_->options().name, fresh_values, n, dim));
    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, mxrec::AllocateSizedOutput(ctx, 0, "values", {n, dim},
                                                   absl::StrCat(n, " rows, dim ", dim), &values));
    std::unique_ptr<bool[]> fresh(new bool[static_cast<size_t>(std::max<int64_t>(n, 1))]);
    float* out = values->flat<float>().data();
    auto pool = mxrec::Registry::Global().pool();
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(table_->tier()->Swap(
                            component_, rows.flat<int32_t>().data(), n,
                            current.flat<float>().data(), out, fresh.get(), pool.get())));
    // New IDs take the initializer's value (rows the tier did not hold).
    FillFresh(fresh_values, fresh.get(), n, dim, [out, dim](int64_t i) { return out + i * dim; });
  }
};

// The swap applied to the variable's own buffer (a variable on the CPU): no
// gather of the victims' rows, no scatter of the new values.
class MxrecTierSwapInPlaceOp : public TierOpBase {
 public:
  using TierOpBase::TierOpBase;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(1);
    const Tensor& fresh_values = ctx->input(2);
    const int64_t dim = table_->options().dim;
    OP_REQUIRES_OK(ctx, mxrec::CheckInputRank(*this, table_->options().name, "rows", rows, 1));
    const int64_t n = rows.NumElements();
    OP_REQUIRES_OK(ctx, CheckFresh(table_->options().name, fresh_values, n, dim));
    core::RefCountPtr<Var> var;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &var));
    // Before the float access below: it would copy a shared buffer of another
    // type as floats (a CHECK failure). A variable's type never changes.
    OP_REQUIRES(ctx, var->tensor()->dtype() == DT_FLOAT,
                absl::InvalidArgumentError(absl::StrCat(
                    "MxrecTierSwapInPlace on table '", table_->options().name,
                    "': the variable must be float32 [rows, ", dim, "], got ",
                    DataTypeString(var->tensor()->dtype()), " ",
                    var->tensor()->shape().DebugString())));
    // As TensorFlow's sparse updates do: dense reads of the variable copy from
    // now on (copy-on-read mode), and a buffer still shared with an earlier
    // read is copied before it is written.
    OP_REQUIRES_OK(ctx, EnsureSparseVariableAccess<Eigen::ThreadPoolDevice, float>(ctx, var.get()));
    mutex_lock lock(*var->mu());
    OP_REQUIRES_OK(ctx, PrepareToUpdateVariable<Eigen::ThreadPoolDevice, float>(
                            ctx, var->tensor(), /*copy_on_read_mode=*/false));
    Tensor* params = var->tensor();
    OP_REQUIRES(ctx,
                params->dtype() == DT_FLOAT && params->dims() == 2 && params->dim_size(1) == dim,
                absl::InvalidArgumentError(absl::StrCat(
                    "MxrecTierSwapInPlace on table '", table_->options().name,
                    "': the variable must be float32 [rows, ", dim, "], got ",
                    DataTypeString(params->dtype()), " ", params->shape().DebugString())));
    std::unique_ptr<bool[]> fresh(new bool[static_cast<size_t>(std::max<int64_t>(n, 1))]);
    float* base = params->flat<float>().data();
    const int32_t* row = rows.flat<int32_t>().data();
    // The engine's pool (KEY_PROCESS_THREAD_NUM threads) copies a large plan's rows.
    auto pool = mxrec::Registry::Global().pool();
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(table_->tier()->SwapInPlace(
                            component_, row, n, base, params->dim_size(0), fresh.get(),
                            pool.get())));
    FillFresh(fresh_values, fresh.get(), n, dim,
              [base, row, dim](int64_t i) { return base + row[i] * dim; });
  }
};

template <typename Tids>
class MxrecTierReadOp : public TierOpBase {
 public:
  using TierOpBase::TierOpBase;

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, mxrec::CheckInputRank(*this, table_->options().name, "ids",
                                              ctx->input(0), 1));
    const auto ids = ctx->input(0).flat<Tids>();
    const int64_t n = ids.size();
    const int64_t dim = table_->options().dim;
    std::vector<int64_t> keys(ids.data(), ids.data() + n);
    Tensor* values = nullptr;
    Tensor* found = nullptr;
    OP_REQUIRES_OK(ctx, mxrec::AllocateSizedOutput(ctx, 0, "values", {n, dim},
                                                   absl::StrCat(n, " ids, dim ", dim), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &found));
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(table_->ReadTier(
                            component_, keys.data(), n, values->flat<float>().data(),
                            found->flat<bool>().data())));
  }
};

REGISTER_KERNEL_BUILDER(Name("MxrecTierSwap").Device(DEVICE_CPU), MxrecTierSwapOp);
REGISTER_KERNEL_BUILDER(Name("MxrecTierSwapInPlace").Device(DEVICE_CPU), MxrecTierSwapInPlaceOp);
REGISTER_KERNEL_BUILDER(Name("MxrecTierRead").Device(DEVICE_CPU).TypeConstraint<int32_t>("Tids"),
                        MxrecTierReadOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("MxrecTierRead").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tids"),
                        MxrecTierReadOp<int64_t>);

}  // namespace
}  // namespace tensorflow
