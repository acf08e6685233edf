// Kernels of MxrecExportTable / MxrecImportTable.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/huge_pages.h"
#include "engine/registry.h"
#include "kernels/input_checks.h"
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
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(mxrec::GuardAllocation(
                            table_->options().name, "a snapshot of the host state", [&] {
                              return table_->ExportState(/*since_epoch=*/0,
                                                         /*delta_chain=*/false, &state);
                            })));
    OP_REQUIRES_OK(ctx, Emit(ctx, 0, state.keys.owned()));
    OP_REQUIRES_OK(ctx, Emit(ctx, 1, state.rows.owned()));
    OP_REQUIRES_OK(ctx, Emit(ctx, 2, state.counts.owned()));
    OP_REQUIRES_OK(ctx, Emit(ctx, 3, state.last_seen.owned()));
    OP_REQUIRES_OK(ctx, Emit(ctx, 4, state.free_rows));
    const std::vector<int64_t> meta = {state.next_row, state.newest_timestamp,
                                       state.counting_frozen ? 1 : 0};
    OP_REQUIRES_OK(ctx, Emit(ctx, 5, meta));
    Tensor* threshold = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(6, TensorShape({}), &threshold));
    threshold->scalar<double>()() = state.access_threshold;
    OP_REQUIRES_OK(ctx, Emit(ctx, 7, std::vector<int32_t>(state.in_host.begin(),
                                                          state.in_host.end())));
    OP_REQUIRES_OK(ctx, Emit(ctx, 8, state.lru_rows));
    OP_REQUIRES_OK(ctx, Emit(ctx, 9, std::vector<int64_t>(state.lru_ages.begin(),
                                                          state.lru_ages.end())));
    Tensor* names = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            10, TensorShape({static_cast<int64_t>(state.tier_components.size())}),
                            &names));
    for (size_t i = 0; i < state.tier_components.size(); ++i) {
      names->flat<tstring>()(i) = state.tier_components[i];
    }
    OP_REQUIRES_OK(ctx, Emit(ctx, 11, std::vector<int64_t>(state.tier_present.begin(),
                                                           state.tier_present.end())));
    const int64_t n_host = static_cast<int64_t>(state.tier_present.size());
    const int64_t n_comp = static_cast<int64_t>(state.tier_components.size());
    Tensor* values = nullptr;
    const int64_t dim = table_->options().dim;
    OP_REQUIRES_OK(ctx, mxrec::AllocateSizedOutput(
                            ctx, 12, "tier_values", {n_host, n_comp, dim},
                            absl::StrCat(n_host, " host-tier IDs, ", n_comp, " components, dim ",
                                         dim),
                            &values));
    if (!state.tier_values.empty()) {
      std::memcpy(values->flat<float>().data(), state.tier_values.data(),
                  state.tier_values.size() * sizeof(float));
    }
  }
};

class MxrecImportTableOp : public TableOpBase {
 public:
  using TableOpBase::TableOpBase;

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, CheckInputs(ctx));
    OP_REQUIRES_OK(ctx, CheckValues(ctx));
    mxrec::TableState state;
    state.keys = Read<int64_t>(ctx->input(0));
    state.rows = Read<int32_t>(ctx->input(1));
    state.counts = Read<float>(ctx->input(2));
    state.last_seen = Read<int64_t>(ctx->input(3));
    state.free_rows = Read<int32_t>(ctx->input(4));
    const auto m = ctx->input(5).flat<int64_t>();
    state.next_row = m(0);
    state.newest_timestamp = m(1);
    state.counting_frozen = m(2) != 0;
    state.access_threshold = ctx->input(6).scalar<double>()();
    if (ctx->num_inputs() > 7) ReadTierFields(ctx, &state);
    OP_REQUIRES_OK(ctx, mxrec::ToTfStatus(mxrec::GuardAllocation(
                            table_->options().name, "restoring the host state",
                            [&] { return table_->ImportState(state); })));
  }

 private:
  // Ranks of every input, and the lengths that must agree, before any is read.
  absl::Status CheckInputs(OpKernelContext* ctx) const {
    const std::string& table = table_->options().name;
    static constexpr const char* kVectors[] = {"keys", "rows", "counts", "last_seen",
                                               "free_rows", "meta"};
    for (int i = 0; i < 6; ++i) {
      TF_RETURN_IF_ERROR(mxrec::CheckInputRank(*this, table, kVectors[i], ctx->input(i), 1));
    }
    const int64_t n = ctx->input(0).NumElements();
    for (int i = 1; i < 4; ++i) {
      TF_RETURN_IF_ERROR(
          mxrec::CheckInputDim(*this, table, kVectors[i], ctx->input(i), 0, n, "one per key"));
    }
    TF_RETURN_IF_ERROR(mxrec::CheckInputDim(*this, table, "meta", ctx->input(5), 0, 3,
                                            "rows ever used, newest batch time, counting frozen"));
    TF_RETURN_IF_ERROR(mxrec::CheckInputRank(*this, table, "threshold", ctx->input(6), 0));
    if (ctx->num_inputs() == 7) return absl::OkStatus();
    static constexpr const char* kTierVectors[] = {"in_host", "lru_rows", "lru_ages",
                                                   "tier_components", "tier_present"};
    for (int i = 7; i < 12; ++i) {
      TF_RETURN_IF_ERROR(mxrec::CheckInputRank(*this, table, kTierVectors[i - 7], ctx->input(i), 1));
    }
    // in_host is empty in the snapshot of a table without a host tier.
    if (ctx->input(7).NumElements() != 0) {
      TF_RETURN_IF_ERROR(
          mxrec::CheckInputDim(*this, table, "in_host", ctx->input(7), 0, n, "one per key"));
    }
    TF_RETURN_IF_ERROR(mxrec::CheckInputDim(*this, table, "lru_ages", ctx->input(9), 0,
                                            ctx->input(8).NumElements(), "one per lru_rows"));
    const Tensor& values = ctx->input(12);
    TF_RETURN_IF_ERROR(mxrec::CheckInputRank(*this, table, "tier_values", values, 3));
    TF_RETURN_IF_ERROR(mxrec::CheckInputDim(*this, table, "tier_values", values, 0,
                                            ctx->input(11).NumElements(),
                                            "one per tier_present"));
    TF_RETURN_IF_ERROR(mxrec::CheckInputDim(*this, table, "tier_values", values, 1,
                                            ctx->input(10).NumElements(),
                                            "one per tier_components"));
    return mxrec::CheckInputDim(*this, table, "tier_values", values, 2, table_->options().dim,
                                "the table's dim");
  }

  // The values the engine reads as they are: a row below -1 (-1: not admitted)
  // would read as not admitted, a count or threshold that is negative or not
  // finite would change admission from then on.
  absl::Status CheckValues(OpKernelContext* ctx) const {
    const std::string& table = table_->options().name;
    const auto invalid = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrCat("mxrec table '", table, "': ", type_string(), " ", what));
    };
    const auto rows = ctx->input(1).flat<int32_t>();
    for (int64_t i = 0; i < rows.size(); ++i) {
      if (rows(i) < -1) {
        return invalid(absl::StrCat("input 'rows': rows[", i, "] = ", rows(i),
                                    "; a row is >= 0, or -1 for an ID not admitted"));
      }
    }
    const auto counts = ctx->input(2).flat<float>();
    for (int64_t i = 0; i < counts.size(); ++i) {
      if (!(counts(i) >= 0) || std::isinf(counts(i))) {
        return invalid(absl::StrCat("input 'counts': counts[", i, "] = ", counts(i),
                                    "; an admission count is finite and >= 0"));
      }
    }
    const double threshold = ctx->input(6).scalar<double>()();
    if (!(threshold >= 0)) {
      return invalid(absl::StrCat("input 'threshold' = ", threshold,
                                  "; the admission threshold is >= 0"));
    }
    return absl::OkStatus();
  }

  // MxrecImportTableTiered: the host-tier fields of MxrecExportTable.
  static void ReadTierFields(OpKernelContext* ctx, mxrec::TableState* state_ptr) {
    mxrec::TableState& state = *state_ptr;
    const std::vector<int32_t> in_host = Read<int32_t>(ctx->input(7));
    state.in_host.assign(in_host.begin(), in_host.end());
    state.lru_rows = Read<int32_t>(ctx->input(8));
    const std::vector<int64_t> ages = Read<int64_t>(ctx->input(9));
    state.lru_ages.assign(ages.begin(), ages.end());
    const auto names = ctx->input(10).flat<tstring>();
    for (int64_t i = 0; i < names.size(); ++i) state.tier_components.emplace_back(names(i));
    const std::vector<int64_t> present = Read<int64_t>(ctx->input(11));
    state.tier_present.assign(present.begin(), present.end());
    state.tier_values = Read<float>(ctx->input(12));
  }
};

REGISTER_KERNEL_BUILDER(Name("MxrecExportTable").Device(DEVICE_CPU), MxrecExportTableOp);
REGISTER_KERNEL_BUILDER(Name("MxrecImportTable").Device(DEVICE_CPU), MxrecImportTableOp);
REGISTER_KERNEL_BUILDER(Name("MxrecImportTableTiered").Device(DEVICE_CPU), MxrecImportTableOp);

}  // namespace
}  // namespace tensorflow
