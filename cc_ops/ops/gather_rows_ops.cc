// Registrations of the fused restore gather (the lookup's last step) and its
// gradient. The lookup gathers the batch's unique rows [U, dim] from the table;
// MxrecGatherRows then gives each of the N positions its row in one pass
// (restore[i] == U: the default row), and MxrecGatherRowsGrad sums the N rows
// of the gradient straight into the U unique rows. They replace
// concat(unique, default)[restore] and unsorted_segment_sum(dy, restore, U + 1)[:U].
// Kernels live in ../kernels/gather_rows_kernels.cc (CPU only).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("MxrecGatherRows")
    .Input("unique_emb: T")
    .Input("restore: Tindices")
    .Input("default_row: T")
    .Output("emb: T")
    .Attr("T: {float, double}")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unique_emb;
      ShapeHandle restore;
      ShapeHandle default_row;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &unique_emb));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &restore));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &default_row));
      DimensionHandle dim;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(unique_emb, 1), c->Dim(default_row, 0), &dim));
      c->set_output(0, c->Matrix(c->Dim(restore, 0), dim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
emb[i] = unique_emb[restore[i]] for restore[i] < U, default_row for restore[i] == U
(U = the rows of unique_emb); any other value is an InvalidArgument. The same
values, bit for bit, as gather(concat([unique_emb, [default_row]]), restore).
)doc");

REGISTER_OP("MxrecGatherRowsGrad")
    .Input("grad: T")
    .Input("restore: Tindices")
    .Input("num_unique: Tindices")
    .Output("unique_grad: T")
    .Attr("T: {float, double}")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle grad;
      ShapeHandle restore;
      ShapeHandle num_unique;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &restore));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &num_unique));
      DimensionHandle n;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(grad, 0), c->Dim(restore, 0), &n));
      DimensionHandle u;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &u));
      c->set_output(0, c->Matrix(u, c->Dim(grad, 1)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The gradient of MxrecGatherRows with respect to unique_emb: unique_grad[j] is the
sum of grad[i] over the positions i with restore[i] == j, added in increasing i
from zero (unsorted_segment_sum's order, so the same floats); positions with
restore[i] == num_unique (the default row) get no gradient.
)doc");

}  // namespace tensorflow
