// Registrations of the host-tier ops (DDR/SSD mode): the step applies the key
// stage's swap plans with MxrecTierSwap (MxrecTierSwapInPlace on a CPU
// variable) and evaluation reads host-tier rows in
// place with MxrecTierRead. Kernels live in ../kernels/tier_kernels.cc.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("MxrecTierSwap")
    .Input("rows: int32")
    .Input("current: float")
    .Input("fresh_values: float")
    .Output("values: float")
    .Attr("table_key: string")
    .Attr("component: string = 'embedding'")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle rows;
      ShapeHandle current;
      ShapeHandle fresh_values;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &current));
      TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(2), 2, &fresh_values));
      DimensionHandle n;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(rows, 0), c->Dim(current, 0), &n));
      c->set_output(0, c->Matrix(n, c->Dim(current, 1)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Applies the next swap plan of one component (the embedding or an optimizer
slot) of a table with a host tier. `rows` are the batch's re-filled device rows
(the key stage's reused_rows) and `current` their values before the step; the
victims' values go to the host tier, and `values` holds the rows' new values:
their new IDs' values from the host tier, or, for IDs the tier does not hold
(new IDs), the row of `fresh_values` ([n, dim]: the initializer's rows) or
`fresh_values` itself (a scalar: the slot's initial value).
)doc");

REGISTER_OP("MxrecTierSwapInPlace")
    .Input("variable: resource")
    .Input("rows: int32")
    .Input("fresh_values: float")
    .Attr("table_key: string")
    .Attr("component: string = 'embedding'")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle rows;
      ShapeHandle fresh_values;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &rows));
      TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(2), 2, &fresh_values));
      return absl::OkStatus();
    })
    .Doc(R"doc(
MxrecTierSwap applied to the variable itself, for a float32 variable in host
memory (a table on the CPU). The victims' values are read from
`variable[rows]` and the rows get their new IDs' values there (from the host
tier, else from `fresh_values`), with no gather and scatter around the swap.
)doc");

REGISTER_OP("MxrecTierRead")
    .Input("ids: Tids")
    .Output("values: float")
    .Output("found: bool")
    .Attr("Tids: {int32, int64}")
    .Attr("table_key: string")
    .Attr("component: string = 'embedding'")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &ids));
      c->set_output(0, c->Matrix(c->Dim(ids, 0), InferenceContext::kUnknownDim));
      c->set_output(1, c->Vector(c->Dim(ids, 0)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Reads the host-tier values of `ids` without moving them (evaluation):
values[i] is the ID's row where found[i], zeros otherwise.
)doc");

}  // namespace tensorflow
