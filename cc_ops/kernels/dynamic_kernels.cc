// Kernels of the dynamic-expansion ops: thin adapters from tensors to the
// engine's DynamicStore, which they find by table key at construction.
#include <memory>
#include <string>
#include <vector>

#include "engine/dynamic_store.h"
#include "kernels/input_checks.h"
#include "kernels/status_util.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace {

// Finds the store and checks the op's dim against it.
class DynamicStoreKernel : public OpKernel {
 public:
  explicit DynamicStoreKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string key;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_key", &key));
    OP_REQUIRES_OK(ctx,
                   mxrec::ToTfStatus(mxrec::DynamicStoreRegistry::Global().Get(key, &store_)));
    if (ctx->HasAttr("dim")) {
      int64_t dim = 0;
      OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim));
      OP_REQUIRES(ctx, dim == store_->options().dim,
                  absl::InvalidArgumentError(absl::StrCat(
                      "mxrec table '", store_->options().name, "': ", type_string(),
                      " was built for dim ", dim, " but the store has dim ",
                      store_->options().dim)));
    }
  }

 protected:
  const std::string& table_name() const { return store_->options().name; }

  // Checks that addresses is a vector [N].
  absl::Status CheckAddresses(const Tensor& addresses) const {
    return mxrec::CheckInputRank(*this, table_name(), "addresses", addresses, 1);
  }

  // Checks addresses [N] and rows [N, dim] (the input named `input`).
  absl::Status CheckRows(const Tensor& addresses, const Tensor& values, const char* input) const {
    const int64_t dim = store_->options().dim;
    TF_RETURN_IF_ERROR(CheckAddresses(addresses));
    if (!TensorShapeUtils::IsMatrix(values.shape()) ||
        values.dim_size(0) != addresses.dim_size(0) || values.dim_size(1) != dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mxrec table '", table_name(), "': ", type_string(), " input '", input,
          "' must have shape [", addresses.dim_size(0), ", ", dim, "] for ",
          addresses.dim_size(0), " addresses, got ", values.shape().DebugString()));
    }
    return absl::OkStatus();
  }

  // Reads the scalar input `index` (named `input`) into *value.
  absl::Status ReadScalar(OpKernelContext* ctx, int index, const char* input,
                          float* value) const {
    TF_RETURN_IF_ERROR(mxrec::CheckInputRank(*this, table_name(), input, ctx->input(index), 0));
    *value = ctx->input(index).scalar<float>()();
    return absl::OkStatus();
  }

  std::shared_ptr<mxrec::DynamicStore> store_;
};

class MxrecDynamicEnsureRowsOp : public DynamicStoreKernel {
 public:
  using DynamicStoreKernel::DynamicStoreKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& addresses = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckAddresses(addresses));
    std::vector<int64_t> fresh;
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(store_->EnsureRows(
                            addresses.flat<int64_t>().data(), addresses.NumElements(), &fresh)));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({static_cast<int64_t>(fresh.size())}), &out));
    std::copy(fresh.begin(), fresh.end(), out->flat<int64_t>().data());
  }
};

class MxrecDynamicGatherOp : public DynamicStoreKernel {
 public:
  using DynamicStoreKernel::DynamicStoreKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& addresses = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckAddresses(addresses));
    const int64_t n = addresses.NumElements();
    Tensor* out = nullptr;
    const int64_t dim = store_->options().dim;
    OP_REQUIRES_OK(ctx, mxrec::AllocateSizedOutput(ctx, 0, "values", {n, dim},
                                                   absl::StrCat(n, " addresses, dim ", dim),
                                                   &out));
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(store_->Read(addresses.flat<int64_t>().data(), n, -1,
                                                       out->flat<float>().data(),
                                                       "MxrecDynamicGather")));
  }
};

class MxrecDynamicAssignOp : public DynamicStoreKernel {
 public:
  using DynamicStoreKernel::DynamicStoreKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& addresses = ctx->input(0);
    const Tensor& values = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckRows(addresses, values, "values"));
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(store_->Write(
                            addresses.flat<int64_t>().data(), addresses.NumElements(), -1,
                            values.flat<float>().data(), "MxrecDynamicAssign")));
  }
};

class MxrecDynamicApplySgdOp : public DynamicStoreKernel {
 public:
  using DynamicStoreKernel::DynamicStoreKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& addresses = ctx->input(0);
    const Tensor& grads = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckRows(addresses, grads, "grads"));
    float lr = 0.0f;
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 2, "lr", &lr));
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(store_->ApplySgd(
                            addresses.flat<int64_t>().data(), addresses.NumElements(),
                            grads.flat<float>().data(), lr)));
  }
};

class MxrecDynamicApplyAdagradOp : public DynamicStoreKernel {
 public:
  explicit MxrecDynamicApplyAdagradOp(OpKernelConstruction* ctx) : DynamicStoreKernel(ctx) {
    if (!store_) return;
    std::string slot;
    float initial = 0.0f;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("accumulator_slot", &slot));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initial_accumulator_value", &initial));
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(store_->AddSlot(slot, initial, &slot_)));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& addresses = ctx->input(0);
    const Tensor& grads = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckRows(addresses, grads, "grads"));
    float lr = 0.0f;
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 2, "lr", &lr));
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(store_->ApplyAdagrad(
                            addresses.flat<int64_t>().data(), addresses.NumElements(),
                            grads.flat<float>().data(), lr, slot_)));
  }

 private:
  int slot_ = 0;
};

class MxrecDynamicApplyLazyAdamOp : public DynamicStoreKernel {
 public:
  explicit MxrecDynamicApplyLazyAdamOp(OpKernelConstruction* ctx) : DynamicStoreKernel(ctx) {
    if (!store_) return;
    std::string m_name;
    std::string v_name;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("m_slot", &m_name));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("v_slot", &v_name));
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(store_->AddSlot(m_name, 0.0f, &m_slot_)));
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(store_->AddSlot(v_name, 0.0f, &v_slot_)));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& addresses = ctx->input(0);
    const Tensor& grads = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckRows(addresses, grads, "grads"));
    mxrec::LazyAdamParams params;
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 2, "lr", &params.lr));
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 3, "beta1", &params.beta1));
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 4, "beta2", &params.beta2));
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 5, "epsilon", &params.epsilon));
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 6, "beta1_power", &params.beta1_power));
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 7, "beta2_power", &params.beta2_power));
    OP_REQUIRES(ctx, params.beta1_power < 1.0f,
                absl::InvalidArgumentError(absl::StrCat(
                    "mxrec table '", table_name(), "': LazyAdam's beta1_power must be < 1, got ",
                    params.beta1_power)));
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(store_->ApplyLazyAdam(
                            addresses.flat<int64_t>().data(), addresses.NumElements(),
                            grads.flat<float>().data(), params, m_slot_, v_slot_)));
  }

 private:
  int m_slot_ = 0;
  int v_slot_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("MxrecDynamicEnsureRows").Device(DEVICE_CPU),
                        MxrecDynamicEnsureRowsOp);
REGISTER_KERNEL_BUILDER(Name("MxrecDynamicGather").Device(DEVICE_CPU), MxrecDynamicGatherOp);
REGISTER_KERNEL_BUILDER(Name("MxrecDynamicAssign").Device(DEVICE_CPU), MxrecDynamicAssignOp);
REGISTER_KERNEL_BUILDER(Name("MxrecDynamicApplySgd").Device(DEVICE_CPU),
                        MxrecDynamicApplySgdOp);
REGISTER_KERNEL_BUILDER(Name("MxrecDynamicApplyAdagrad").Device(DEVICE_CPU),
                        MxrecDynamicApplyAdagradOp);
REGISTER_KERNEL_BUILDER(Name("MxrecDynamicApplyLazyAdam").Device(DEVICE_CPU),
                        MxrecDynamicApplyLazyAdamOp);

}  // namespace
}  // namespace tensorflow
