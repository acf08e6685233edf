// Kernels of the host-stage ops: thin adapters from tensors to the engine.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/key_stage.h"
#include "engine/registry.h"
#include "kernels/input_checks.h"
#include "kernels/status_util.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace {

absl::Status CopyRows(OpKernelContext* ctx, int index, const std::vector<int32_t>& values) {
  Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(
      ctx->allocate_output(index, TensorShape({static_cast<int64_t>(values.size())}), &out));
  if (!values.empty()) {
    std::memcpy(out->flat<int32_t>().data(), values.data(), values.size() * sizeof(int32_t));
  }
  return absl::OkStatus();
}

template <typename Tids>
class MxrecKeyStageOp : public OpKernel {
 public:
  explicit MxrecKeyStageOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::vector<std::string> keys;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_keys", &keys));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("is_train", &is_train_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("deferred", &deferred_));
    for (const auto& key : keys) {
      std::shared_ptr<mxrec::HostTable> table;
      OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(mxrec::Registry::Global().GetTable(key, &table)));
      if (!table_names_.empty()) table_names_ += ", ";
      table_names_ += table->options().name;
      tables_.push_back(std::move(table));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList ids;
    OP_REQUIRES_OK(ctx, ctx->input_list("ids", &ids));
    OP_REQUIRES(ctx, ids.size() == static_cast<int>(tables_.size()),
                absl::InvalidArgumentError(absl::StrCat("MxrecKeyStage got ", ids.size(), " ID tensors for ",
                                        tables_.size(), " tables")));
    const Tensor& timestamp = ctx->input(ids.size());
    OP_REQUIRES_OK(ctx, mxrec::CheckInputRank(*this, table_names_, "timestamp", timestamp, 0));
    const int n = ids.size();
    std::vector<std::vector<int64_t>> widened(n);
    std::vector<mxrec::KeySpan> spans(n);
    std::vector<mxrec::HostTable*> tables(n);
    for (int i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, TensorShapeUtils::IsVector(ids[i].shape()),
                  absl::InvalidArgumentError(absl::StrCat("IDs of table '", tables_[i]->options().name,
                                          "' must be a vector, got shape ",
                                          ids[i].shape().DebugString())));
      const auto flat = ids[i].flat<Tids>();
      if constexpr (std::is_same<Tids, int64_t>::value) {
        spans[i].keys = flat.data();
      } else {
        widened[i].assign(flat.data(), flat.data() + flat.size());
        spans[i].keys = widened[i].data();
      }
      spans[i].size = flat.size();
      tables[i] = tables_[i].get();
    }
    // The restore index goes straight into its output tensor.
    std::vector<mxrec::BatchPlan> plans(n);
    for (int i = 0; i < n; ++i) {
      Tensor* restore = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(n + i, TensorShape({spans[i].size}), &restore));
      plans[i].restore_out = restore->flat<int32_t>().data();
    }
    auto pool = mxrec::Registry::Global().pool();
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(mxrec::RunKeyStage(
                            tables, spans, is_train_, timestamp.scalar<int64_t>()(), pool.get(),
                            &plans, deferred_)));
    Tensor* batch_ids = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3 * n, TensorShape({n}), &batch_ids));
    for (int i = 0; i < n; ++i) {
      OP_REQUIRES_OK(ctx, CopyRows(ctx, i, plans[i].unique_rows));
      OP_REQUIRES_OK(ctx, CopyRows(ctx, 2 * n + i, plans[i].reused_rows));
      batch_ids->vec<int64_t>()(i) = static_cast<int64_t>(plans[i].batch_id);
    }
  }

 private:
  bool is_train_ = true;
  bool deferred_ = false;
  std::vector<std::shared_ptr<mxrec::HostTable>> tables_;
  std::string table_names_;  // for messages
};

REGISTER_KERNEL_BUILDER(
    Name("MxrecKeyStage").Device(DEVICE_CPU).TypeConstraint<int32_t>("Tids"),
    MxrecKeyStageOp<int32_t>);
REGISTER_KERNEL_BUILDER(
    Name("MxrecKeyStage").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tids"),
    MxrecKeyStageOp<int64_t>);

class MxrecCommitBatchesOp : public OpKernel {
 public:
  explicit MxrecCommitBatchesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::vector<std::string> keys;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_keys", &keys));
    for (const auto& key : keys) {
      std::shared_ptr<mxrec::HostTable> table;
      OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(mxrec::Registry::Global().GetTable(key, &table)));
      tables_.push_back(std::move(table));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    OP_REQUIRES(ctx,
                TensorShapeUtils::IsVector(ids.shape()) &&
                    ids.NumElements() == static_cast<int64_t>(tables_.size()),
                absl::InvalidArgumentError(absl::StrCat(
                    "MxrecCommitBatches: batch_ids must be a vector of ", tables_.size(),
                    " ids, got shape ", ids.shape().DebugString())));
    const auto flat = ids.vec<int64_t>();
    for (size_t i = 0; i < tables_.size(); ++i) {
      if (flat(i) == 0) continue;
      OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(tables_[i]->Commit(static_cast<uint64_t>(flat(i)))));
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int32_t>()() = 0;
  }

 private:
  std::vector<std::shared_ptr<mxrec::HostTable>> tables_;
};

REGISTER_KERNEL_BUILDER(Name("MxrecCommitBatches").Device(DEVICE_CPU), MxrecCommitBatchesOp);

template <typename T>
class MxrecSetThresholdOp : public OpKernel {
 public:
  explicit MxrecSetThresholdOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string key;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_key", &key));
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(mxrec::Registry::Global().GetTable(key, &table_)));
  }

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, mxrec::CheckInputRank(*this, table_->options().name, "threshold",
                                              ctx->input(0), 0));
    const double threshold = static_cast<double>(ctx->input(0).scalar<T>()());
    OP_REQUIRES(ctx, threshold >= 0,
                absl::InvalidArgumentError(absl::StrCat("set_threshold for table '", table_->options().name,
                                        "': the threshold must be >= 0, got ", threshold)));
    table_->SetThreshold(threshold);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int32_t>()() = 0;
  }

 private:
  std::shared_ptr<mxrec::HostTable> table_;
};

REGISTER_KERNEL_BUILDER(Name("MxrecSetThreshold").Device(DEVICE_CPU).TypeConstraint<int32_t>("T"),
                        MxrecSetThresholdOp<int32_t>);
REGISTER_KERNEL_BUILDER(
    Name("MxrecSetThreshold").Device(DEVICE_CPU).TypeConstraint<int64_t>("T"),
    MxrecSetThresholdOp<int64_t>);
REGISTER_KERNEL_BUILDER(Name("MxrecSetThreshold").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        MxrecSetThresholdOp<float>);

}  // namespace
}  // namespace tensorflow
