// Registrations and shape functions of mxrec's host-stage ops. Kernels live in
// ../kernels; the engine they adapt lives in ../engine.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("MxrecKeyStage")
    .Input("ids: N * Tids")
    .Input("timestamp: int64")
    .Input("weights: W * int64")
    .Output("unique_rows: N * int32")
    .Output("restore: N * int32")
    .Output("reused_rows: N * int32")
    .Output("batch_ids: int64")
    .Attr("N: int >= 1")
    .Attr("W: int >= 0 = 0")
    .Attr("Tids: {int32, int64}")
    .Attr("table_keys: list(string)")
    .Attr("is_train: bool = true")
    .Attr("deferred: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int n = 0;
      int w = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("W", &w));
      if (w != 0 && w != n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "MxrecKeyStage: ", w, " weight tensors for ", n,
            " ID tensors; give one per ID tensor or none"));
      }
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(n), 0, &unused));
      for (int i = 0; i < n; ++i) {
        ShapeHandle ids;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &ids));
        if (w != 0) TF_RETURN_IF_ERROR(c->Merge(ids, c->input(n + 1 + i), &ids));
        c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
        c->set_output(n + i, ids);
        c->set_output(2 * n + i, c->Vector(InferenceContext::kUnknownDim));
      }
      c->set_output(3 * n, c->Vector(n));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Plans one batch of IDs for each of N tables: deduplicates the IDs, counts and
admits them (when is_train), gives newly admitted IDs a device row, and returns
the rows of the batch's admitted IDs in order of first occurrence, an index per
input position into those rows (len(unique_rows) means the default value), and
the rows that were reused after eviction and must be re-initialised.
timestamp: the batch time in seconds; negative means the wall clock.
weights: none, or one per ID tensor (training only): weights[i][p] >= 1 is how
  many occurrences position p of table i stands for, as if its ID were repeated
  that many times in place (admission counts, statistics); the sum of one
  tensor's weights must be below 2^31. The owner of a sharded table plans the
  unique IDs it received with their occurrence counts so.
deferred: the batch is planned ahead of its step (in the input pipeline); each
  table keeps a training batch pending until MxrecCommitBatches gets its id.
batch_ids: per table, the pending batch's id (0 when not deferred or not training).
)doc");

REGISTER_OP("MxrecKeyStagePacked")
    .Input("ids: Tids")
    .Input("splits: int64")
    .Input("timestamp: int64")
    .Output("unique_rows: int32")
    .Output("unique_splits: int64")
    .Output("restore: int32")
    .Output("reused_rows: int32")
    .Output("reused_splits: int64")
    .Output("batch_ids: int64")
    .Attr("Tids: {int32, int64}")
    .Attr("table_keys: list(string) >= 1")
    .Attr("is_train: bool = true")
    .Attr("deferred: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      std::vector<std::string> keys;
      TF_RETURN_IF_ERROR(c->GetAttr("table_keys", &keys));
      const int64_t n = static_cast<int64_t>(keys.size());
      ShapeHandle ids;
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &ids));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      TF_RETURN_IF_ERROR(c->Merge(c->input(1), c->Vector(n + 1), &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &unused));
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Vector(n + 1));
      c->set_output(2, ids);
      c->set_output(3, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(4, c->Vector(n + 1));
      c->set_output(5, c->Vector(n));
      return absl::OkStatus();
    })
    .Doc(R"doc(
MxrecKeyStage on packed tensors: the IDs of all N = len(table_keys) tables in
one vector, table i's at ids[splits[i]:splits[i+1]] (row splits: splits[0] = 0,
non-decreasing, splits[N] = len(ids)), each table at most once. The outputs are
packed the same way: table i's unique rows are unique_rows[unique_splits[i]:
unique_splits[i+1]], its restore index restore[splits[i]:splits[i+1]] (into its
own unique rows), its reused rows reused_rows[reused_splits[i]:reused_splits[i+1]].
The same plans as MxrecKeyStage on the tables' separate tensors.
)doc");

REGISTER_OP("MxrecCommitBatches")
    .Input("batch_ids: int64")
    .Output("done: int32")
    .Attr("table_keys: list(string)")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
The step of deferred batches runs: each table's batch_ids[i] stops being pending
(see MxrecKeyStage). Ids of 0 are skipped.
)doc");

REGISTER_OP("MxrecSetThreshold")
    .Input("threshold: T")
    .Output("done: int32")
    .Attr("T: {int32, int64, float}")
    .Attr("table_key: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Changes a table's admission threshold; 0 stops counting and keeps the counts.
)doc");

}  // namespace tensorflow
