// Registrations and shape functions of the dynamic-expansion ops: a table's
// rows live in an engine-side store that grows in chunks (see
// engine/dynamic_store.h) and are read, written and updated by int64 address.
// CPU kernels only (../kernels/dynamic_kernels.cc).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

namespace {

// addresses [N] and values [N, dim].
absl::Status CheckRowsShape(InferenceContext* c, int addresses, int values) {
  ShapeHandle address_shape;
  ShapeHandle value_shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(addresses), 1, &address_shape));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(values), 2, &value_shape));
  DimensionHandle unused;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(address_shape, 0), c->Dim(value_shape, 0), &unused));
  int64_t dim = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(value_shape, 1), c->MakeDim(dim), &unused));
  return absl::OkStatus();
}

absl::Status CheckScalars(InferenceContext* c, int first, int last) {
  for (int i = first; i <= last; ++i) {
    ShapeHandle unused;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
  }
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("MxrecDynamicEnsureRows")
    .Input("addresses: int64")
    .Output("fresh: int64")
    .Attr("table_key: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Marks the addresses the key stage gave a batch as in use, growing the table's
store by whole chunks as needed, and returns the addresses that were not in
use yet; the caller writes the table's initializer values into their rows.
)doc");

REGISTER_OP("MxrecDynamicGather")
    .Input("addresses: int64")
    .Output("values: float")
    .Attr("table_key: string")
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle addresses;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &addresses));
      int64_t dim = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Matrix(c->Dim(addresses, 0), dim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Reads the rows at `addresses` [N] of the table's store: values [N, dim].
An address no ID holds is refused.
)doc");

REGISTER_OP("MxrecDynamicAssign")
    .Input("addresses: int64")
    .Input("values: float")
    .Attr("table_key: string")
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return CheckRowsShape(c, 0, 1); })
    .Doc(R"doc(
Writes values [N, dim] into the rows at addresses [N]. Every address is checked
before anything is written.
)doc");

REGISTER_OP("MxrecDynamicApplySgd")
    .Input("addresses: int64")
    .Input("grads: float")
    .Input("lr: float")
    .Attr("table_key: string")
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(CheckRowsShape(c, 0, 1));
      return CheckScalars(c, 2, 2);
    })
    .Doc(R"doc(
SGD by address: row -= lr * g, with the gradients of a repeated address summed.
An invalid address refuses the whole update.
)doc");

REGISTER_OP("MxrecDynamicApplyAdagrad")
    .Input("addresses: int64")
    .Input("grads: float")
    .Input("lr: float")
    .Attr("table_key: string")
    .Attr("dim: int >= 1")
    .Attr("accumulator_slot: string")
    .Attr("initial_accumulator_value: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(CheckRowsShape(c, 0, 1));
      return CheckScalars(c, 2, 2);
    })
    .Doc(R"doc(
Adagrad by address: accum += g^2; row -= lr * g / sqrt(accum), with the
gradients of a repeated address summed. The accumulator is the store slot
`accumulator_slot`, every row starting at initial_accumulator_value.
)doc");

REGISTER_OP("MxrecDynamicApplyLazyAdam")
    .Input("addresses: int64")
    .Input("grads: float")
    .Input("lr: float")
    .Input("beta1: float")
    .Input("beta2: float")
    .Input("epsilon: float")
    .Input("beta1_power: float")
    .Input("beta2_power: float")
    .Attr("table_key: string")
    .Attr("dim: int >= 1")
    .Attr("m_slot: string")
    .Attr("v_slot: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(CheckRowsShape(c, 0, 1));
      return CheckScalars(c, 2, 7);
    })
    .Doc(R"doc(
LazyAdam by address, on the rows given only (moments of other rows do not
decay): m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
row -= lr*sqrt(1-b2^t)/(1-b1^t) * m/(sqrt(v)+epsilon). beta*_power are b^t of
this step; the caller advances them.
)doc");

}  // namespace tensorflow
