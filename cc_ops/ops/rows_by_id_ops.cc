// Registration of MxrecRowsById: the first values of newly admitted IDs, drawn
// from the ID itself (create_table(init_by_id=True)), so that an ID starts
// from the same values whichever row, rank or batch order it gets. The kernel
// lives in ../kernels/rows_by_id_kernels.cc (CPU only).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("MxrecRowsById")
    .Input("ids: int64")
    .Output("rows: float")
    .Attr("dim: int >= 1")
    .Attr("seed: int")
    .Attr("distribution: {'normal', 'truncated_normal', 'uniform'}")
    .Attr("a: float")
    .Attr("b: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &ids));
      int64_t dim = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Matrix(c->Dim(ids, 0), dim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
rows[i] = dim values drawn for ids[i] from one counter-based stream keyed by
(seed, ids[i]): the same ID and seed give the same bits on every call, rank and
machine. normal: mean a, stddev b; truncated_normal: mean a, stddev b, redrawn
until within 2 stddev (TensorFlow's truncation); uniform: in [a, b).
)doc");

REGISTER_OP("MxrecPlanRowsById")
    .Input("ids: Tids")
    .Input("unique_rows: int32")
    .Input("restore: int32")
    .Input("wanted_rows: int32")
    .Output("rows: float")
    .Attr("Tids: {int32, int64}")
    .Attr("dim: int >= 1")
    .Attr("seed: int")
    .Attr("distribution: {'normal', 'truncated_normal', 'uniform'}")
    .Attr("a: float")
    .Attr("b: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle wanted;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &wanted));
      int64_t dim = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Matrix(c->Dim(wanted, 0), dim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
MxrecRowsById of the IDs a key-stage plan gives the rows wanted_rows: over ids [N]
(flattened), unique_rows [U] and restore [N] (U: no row), the ID of row r is the ID
at a position whose restore points at r. Every wanted row must be among unique_rows.
)doc");

}  // namespace tensorflow
