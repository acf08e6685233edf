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

// The tables of a key-stage op's `table_keys` and their names joined for messages.
// `distinct`: a table named twice is refused (one call plans the tables in parallel,
// so a table twice would race its two batches).
absl::Status LookupTables(OpKernelConstruction* ctx, const char* op, bool distinct,
                          std::vector<std::shared_ptr<mxrec::HostTable>>* tables,
                          std::string* names) {
  std::vector<std::string> keys;
  TF_RETURN_IF_ERROR(ctx->GetAttr("table_keys", &keys));
  for (size_t i = 0; i < keys.size(); ++i) {
    std::shared_ptr<mxrec::HostTable> table;
    TF_RETURN_IF_ERROR(mxrec::ToTfStatus(mxrec::Registry::Global().GetTable(keys[i], &table)));
    for (size_t j = 0; distinct && j < i; ++j) {
      if ((*tables)[j].get() == table.get()) {
        return absl::InvalidArgumentError(absl::StrCat(
            op, ": table '", table->options().name, "' is named twice in table_keys (entries ",
            j, " and ", i,
            "); a call plans one batch per table, so two lookups of one table go into "
            "successive calls"));
      }
    }
    if (!names->empty()) *names += ", ";
    *names += table->options().name;
    tables->push_back(std::move(table));
  }
  return absl::OkStatus();
}

template <typename Tids>
class MxrecKeyStageOp : public OpKernel {
 public:
  explicit MxrecKeyStageOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("is_train", &is_train_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("deferred", &deferred_));
    OP_REQUIRES_OK(ctx, LookupTables(ctx, "MxrecKeyStage", false, &tables_, &table_names_));
    int n = 0;
    int weights = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("W", &weights));
    // An eager call runs no shape function: the list lengths are checked here.
    OP_REQUIRES(ctx, n == static_cast<int>(tables_.size()),
                absl::InvalidArgumentError(absl::StrCat(
                    "MxrecKeyStage (tables ", table_names_, "): got ", n, " ID tensors for ",
                    tables_.size(), " tables; give one per table")));
    OP_REQUIRES(ctx, weights == 0 || weights == n,
                absl::InvalidArgumentError(absl::StrCat(
                    "MxrecKeyStage (tables ", table_names_, "): got ", weights,
                    " weight tensors for ", n, " ID tensors; give one per ID tensor or none")));
    OP_REQUIRES(ctx, weights == 0 || is_train_,
                absl::InvalidArgumentError(absl::StrCat(
                    "MxrecKeyStage (tables ", table_names_,
                    "): weights count occurrences for admission, and an evaluation batch "
                    "counts nothing; plan evaluation batches without weights")));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList ids;
    OP_REQUIRES_OK(ctx, ctx->input_list("ids", &ids));
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
    OpInputList weights;
    OP_REQUIRES_OK(ctx, ctx->input_list("weights", &weights));
    for (int i = 0; i < weights.size(); ++i) {
      const std::string& name = tables_[i]->options().name;
      OP_REQUIRES(ctx, weights[i].shape() == ids[i].shape(),
                  absl::InvalidArgumentError(absl::StrCat(
                      "MxrecKeyStage: the weights of table '", name, "' have shape ",
                      weights[i].shape().DebugString(), ", its IDs ",
                      ids[i].shape().DebugString(), "; give one weight per ID")));
      const auto flat = weights[i].flat<int64_t>();
      int64_t total = 0;
      for (int64_t p = 0; p < flat.size(); ++p) {
        OP_REQUIRES(ctx, flat(p) >= 1,
                    absl::InvalidArgumentError(absl::StrCat(
                        "MxrecKeyStage: weight ", flat(p), " at position ", p, " of table '",
                        name, "'; a weight is the number of occurrences a position stands "
                        "for, at least 1")));
        total += flat(p);
        OP_REQUIRES(ctx, total <= INT32_MAX,
                    absl::InvalidArgumentError(absl::StrCat(
                        "MxrecKeyStage: the weights of table '", name, "' add up to more than "
                        "2^31 - 1 occurrences in one batch; plan smaller batches")));
      }
      spans[i].weights = flat.data();
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

// The key stage of several tables in one call on packed tensors: the IDs of all
// tables in one vector, table i's at [splits[i], splits[i+1]); each output also
// one tensor, with row splits per table. The same plans as MxrecKeyStage on the
// tables' separate tensors; a call pays its fixed costs (the tensors' way in and
// out, a fresh output buffer) once, not once per table.
template <typename Tids>
class MxrecKeyStagePackedOp : public OpKernel {
 public:
  explicit MxrecKeyStagePackedOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("is_train", &is_train_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("deferred", &deferred_));
    OP_REQUIRES_OK(ctx, LookupTables(ctx, "MxrecKeyStagePacked", true, &tables_, &table_names_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    const Tensor& splits = ctx->input(1);
    const Tensor& timestamp = ctx->input(2);
    OP_REQUIRES_OK(ctx, mxrec::CheckInputRank(*this, table_names_, "ids", ids, 1));
    OP_REQUIRES_OK(ctx, mxrec::CheckInputRank(*this, table_names_, "splits", splits, 1));
    OP_REQUIRES_OK(ctx, mxrec::CheckInputRank(*this, table_names_, "timestamp", timestamp, 0));
    const int n = static_cast<int>(tables_.size());
    OP_REQUIRES_OK(ctx, mxrec::CheckInputDim(*this, table_names_, "splits", splits, 0, n + 1,
                                             "len(table_keys) + 1, the row splits"));
    const auto bounds = splits.vec<int64_t>();
    const int64_t total = ids.NumElements();
    OP_REQUIRES(ctx, bounds(0) == 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "MxrecKeyStagePacked: splits[0] must be 0 (table '",
                    tables_[0]->options().name, "' starts the IDs), got ", bounds(0))));
    for (int i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, bounds(i + 1) >= bounds(i) && bounds(i + 1) <= total,
                  absl::InvalidArgumentError(absl::StrCat(
                      "MxrecKeyStagePacked: the IDs of table '", tables_[i]->options().name,
                      "' are splits[", i, "]..splits[", i + 1, "] = ", bounds(i), "..",
                      bounds(i + 1), ", which is not a range within the ", total,
                      " IDs (splits must be non-decreasing, from 0 to the number of IDs)")));
    }
    OP_REQUIRES(ctx, bounds(n) == total,
                absl::InvalidArgumentError(absl::StrCat(
                    "MxrecKeyStagePacked: splits[", n, "] = ", bounds(n), " must be the number ",
                    "of IDs, ", total, " (the IDs after table '", tables_[n - 1]->options().name,
                    "' belong to no table)")));
    const auto flat = ids.flat<Tids>();
    const int64_t* keys = nullptr;
    std::vector<int64_t> widened;
    if constexpr (std::is_same<Tids, int64_t>::value) {
      keys = flat.data();
    } else {
      widened.assign(flat.data(), flat.data() + total);
      keys = widened.data();
    }
    Tensor* restore = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({total}), &restore));
    int32_t* restore_base = restore->flat<int32_t>().data();
    std::vector<mxrec::KeySpan> spans(n);
    std::vector<mxrec::HostTable*> tables(n);
    std::vector<mxrec::BatchPlan> plans(n);
    for (int i = 0; i < n; ++i) {
      spans[i].keys = keys + bounds(i);
      spans[i].size = bounds(i + 1) - bounds(i);
      tables[i] = tables_[i].get();
      plans[i].restore_out = restore_base + bounds(i);
    }
    auto pool = mxrec::Registry::Global().pool();
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(mxrec::RunKeyStage(
                            tables, spans, is_train_, timestamp.scalar<int64_t>()(), pool.get(),
                            &plans, deferred_)));
    OP_REQUIRES_OK(ctx, Pack(ctx, 0, 1, plans, &mxrec::BatchPlan::unique_rows));
    OP_REQUIRES_OK(ctx, Pack(ctx, 3, 4, plans, &mxrec::BatchPlan::reused_rows));
    Tensor* batch_ids = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(5, TensorShape({n}), &batch_ids));
    for (int i = 0; i < n; ++i) {
      batch_ids->vec<int64_t>()(i) = static_cast<int64_t>(plans[i].batch_id);
    }
  }

 private:
  // The plans' `field` in one output (index `values`) and its row splits (`splits`).
  static absl::Status Pack(OpKernelContext* ctx, int values, int splits,
                           const std::vector<mxrec::BatchPlan>& plans,
                           std::vector<int32_t> mxrec::BatchPlan::*field) {
    const int64_t n = static_cast<int64_t>(plans.size());
    Tensor* bounds = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(splits, TensorShape({n + 1}), &bounds));
    auto b = bounds->vec<int64_t>();
    b(0) = 0;
    for (int64_t i = 0; i < n; ++i) {
      b(i + 1) = b(i) + static_cast<int64_t>((plans[i].*field).size());
    }
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(values, TensorShape({b(n)}), &out));
    int32_t* dst = out->flat<int32_t>().data();
    for (int64_t i = 0; i < n; ++i) {
      const auto& part = plans[i].*field;
      if (!part.empty()) std::memcpy(dst + b(i), part.data(), part.size() * sizeof(int32_t));
    }
    return absl::OkStatus();
  }

  bool is_train_ = true;
  bool deferred_ = false;
  std::vector<std::shared_ptr<mxrec::HostTable>> tables_;
  std::string table_names_;  // for messages
};

REGISTER_KERNEL_BUILDER(
    Name("MxrecKeyStagePacked").Device(DEVICE_CPU).TypeConstraint<int32_t>("Tids"),
    MxrecKeyStagePackedOp<int32_t>);
REGISTER_KERNEL_BUILDER(
    Name("MxrecKeyStagePacked").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tids"),
    MxrecKeyStagePackedOp<int64_t>);

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
    // Every id is checked before any batch is committed, so a refused call changes nothing.
    for (size_t i = 0; i < tables_.size(); ++i) {
      OP_REQUIRES(ctx, flat(i) >= 0,
                  absl::InvalidArgumentError(absl::StrCat(
                      "MxrecCommitBatches: batch_ids[", i, "] = ", flat(i), " for table '",
                      tables_[i]->options().name,
                      "' is negative; batch ids are the key stage's (1, 2, ...), 0 for none")));
      if (flat(i) == 0) continue;
      OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(
                              tables_[i]->CheckCommit(static_cast<uint64_t>(flat(i)))));
    }
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
