// Kernels of MxrecExportTable / MxrecImportTable.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/registry.h"
#include "kernels/status_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace {

template <typename T>
absl::Status Emit(OpKernelContext* ctx, int index, const std::vector<T>& values) {
  Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(
      ctx->allocate_output(index, TensorShape({static_cast<int64_t>(values.size())}), &out));
  if (!values.empty()) std::memcpy(out->flat<T>().data(), values.data(), values.size() * sizeof(T));
  return absl::OkStatus();
}

template <typename T>
std::vector<T> Read(const Tensor& tensor) {
  const auto flat = tensor.flat<T>();
  return std::vector<T>(flat.data(), flat.data() + flat.size());
}

class TableOpBase : public OpKernel {
 public:
  explicit TableOpBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string key;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_key", &key));
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(mxrec::Registry::Global().GetTable(key, &table_)));
  }

 protected:
  std::shared_ptr<mxrec::HostTable> table_;
};

class MxrecExportTableOp : public TableOpBase {
 public:
  using TableOpBase::TableOpBase;

  void Compute(OpKernelContext* ctx) override {
    mxrec::TableState state;
    table_->ExportState(/*since_epoch=*/0, /*protect_batches=*/0, &state);
    OP_REQUIRES_OK(ctx, Emit(ctx, 0, state.keys));
    OP_REQUIRES_OK(ctx, Emit(ctx, 1, state.rows));
    OP_REQUIRES_OK(ctx, Emit(ctx, 2, state.counts));
    OP_REQUIRES_OK(ctx, Emit(ctx, 3, state.last_seen));
    OP_REQUIRES_OK(ctx, Emit(ctx, 4, state.free_rows));
    const std::vector<int64_t> meta = {state.next_row, state.newest_timestamp,
                                       state.counting_frozen ? 1 : 0};
    OP_REQUIRES_OK(ctx, Emit(ctx, 5, meta));
    Tensor* threshold = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(6, TensorShape({}), &threshold));
    threshold->scalar<double>()() = state.access_threshold;
  }
};

class MxrecImportTableOp : public TableOpBase {
 public:
  using TableOpBase::TableOpBase;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& meta = ctx->input(5);
    OP_REQUIRES(ctx, meta.NumElements() == 3,
                absl::InvalidArgumentError(absl::StrCat(
                    "mxrec table '", table_->options().name,
                    "': checkpointed host meta must hold 3 values, got ", meta.NumElements())));
    mxrec::TableState state;
    state.keys = Read<int64_t>(ctx->input(0));
    state.rows = Read<int32_t>(ctx->input(1));
    state.counts = Read<float>(ctx->input(2));
    state.last_seen = Read<int64_t>(ctx->input(3));
    state.free_rows = Read<int32_t>(ctx->input(4));
    const auto m = meta.flat<int64_t>();
    state.next_row = m(0);
    state.newest_timestamp = m(1);
    state.counting_frozen = m(2) != 0;
    state.access_threshold = ctx->input(6).scalar<double>()();
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(table_->ImportState(state)));
  }
};

REGISTER_KERNEL_BUILDER(Name("MxrecExportTable").Device(DEVICE_CPU), MxrecExportTableOp);
REGISTER_KERNEL_BUILDER(Name("MxrecImportTable").Device(DEVICE_CPU), MxrecImportTableOp);

}  // namespace
}  // namespace tensorflow
