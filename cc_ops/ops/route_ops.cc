// Registration of MxrecRoute: the rank-local part of a sharded lookup
// (mxrec.distributed.routing.route) in one op, in place of TensorFlow's
// unique, stable argsort, gathers, segment sum, bincount and cumsum. The kernel
// lives in ../kernels/route_kernels.cc (CPU only).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;

REGISTER_OP("MxrecRoute")
    .Input("ids: int64")
    .Output("pairs: int64")
    .Output("counts: int32")
    .Output("where: int32")
    .Output("order: int32")
    .Output("index: int32")
    .Attr("size: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      int64_t size = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("size", &size));
      // index has as many values as ids (unknown unless ids' shape is); U is
      // known only when the op runs.
      const DimensionHandle n = c->NumElements(c->input(0));
      const DimensionHandle u = c->UnknownDim();
      c->set_output(0, c->Matrix(u, 2));
      c->set_output(1, c->Vector(size));
      c->set_output(2, c->Matrix(u, 2));
      c->set_output(3, c->Vector(u));
      c->set_output(4, c->Vector(n));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Routes the IDs of one rank to their owners (size: at most 2^20 ranks). ids (any
shape) is read flat, n values (at most 2^31 - 1); the U unique IDs are numbered in the order of their
first occurrence, and owner(id) = ((id * 0x9E3779B97F4A7C15 mod 2^64) >> 33) mod
size on the ID's 64 bits.

pairs: [U, 2], (ID, occurrences in ids) of the unique IDs sorted by owner; IDs
  of one owner keep their first-occurrence order.
counts: [size], unique IDs per owner.
where: [U, 2], (owner, slot in that owner's bucket) of each row of pairs.
order: [U], the first-occurrence number of each row of pairs (a stable argsort
  of the unique IDs' owners).
index: [n], the first-occurrence number of each flat ID's unique ID (the idx of
  tf.unique).
)doc");

}  // namespace tensorflow
