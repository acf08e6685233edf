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
    .Attr("table_key: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < 5; ++i) c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(5, c->Vector(3));
      c->set_output(6, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Snapshot of a table's host state: every tracked ID with its row (-1 while not
admitted), admission count and last batch time; the free rows; meta = [rows
ever used, newest batch time, counting frozen]; the admission threshold.
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

}  // namespace tensorflow
