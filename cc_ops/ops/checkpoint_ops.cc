// Registrations of the ops that move a table's host state in and out of
// checkpoints as ordinary tensors.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("MxrecExportTable")
    .Output("keys: int64")
    .Output("rows: int32")
    .Output("counts: float")
    .Output("last_seen: int64")
    .Output("free_rows: int32")
    .Output("meta: int64")
    .Output("threshold: double")
    .Output("in_host: int32")
    .Output("lru_rows: int32")
    .Output("lru_ages: int64")
    .Output("tier_components: string")
    .Output("tier_present: int64")
    .Output("tier_values: float")
    .Attr("table_key: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < 5; ++i) c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(5, c->Vector(3));
      c->set_output(6, c->Scalar());
      for (int i = 7; i < 12; ++i) c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(12, c->UnknownShapeOfRank(3));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Snapshot of a table's host state: every tracked ID with its row (-1 while not
admitted), admission count and last batch time; the free rows; meta = [rows
ever used, newest batch time, counting frozen]; the admission threshold.
Tables with a host tier also give, per ID, whether its row is in the host tier;
the device cache's rows in recency order with their ages in batches; and the
host-tier values: component names, a mask per host-tier ID, and values
[host-tier IDs, components, dim]. Empty for device-only tables. Fails while
planned batches of a tiered table have not been trained.
)doc");

REGISTER_OP("MxrecImportTable")
    .Input("keys: int64")
    .Input("rows: int32")
    .Input("counts: float")
    .Input("last_seen: int64")
    .Input("free_rows: int32")
    .Input("meta: int64")
    .Input("threshold: double")
    .Attr("table_key: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      for (int i = 0; i < 6; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(6), 0, &unused));
      return absl::OkStatus();
    })
    .Doc("Replaces a table's host state with a snapshot from MxrecExportTable.");

REGISTER_OP("MxrecImportTableTiered")
    .Input("keys: int64")
    .Input("rows: int32")
    .Input("counts: float")
    .Input("last_seen: int64")
    .Input("free_rows: int32")
    .Input("meta: int64")
    .Input("threshold: double")
    .Input("in_host: int32")
    .Input("lru_rows: int32")
    .Input("lru_ages: int64")
    .Input("tier_components: string")
    .Input("tier_present: int64")
    .Input("tier_values: float")
    .Attr("table_key: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      for (int i = 0; i < 6; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(6), 0, &unused));
      for (int i = 7; i < 12; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
      return absl::OkStatus();
    })
    .Doc(R"doc(
MxrecImportTable with the tier fields of MxrecExportTable (in_host ...
tier_values): a table with a host tier gets its host-tier rows back too.
)doc");

}  // namespace tensorflow
