// Registrations of the send-back plan of the sharded exchange
// (mxrec/distributed/id_exchange.py, send_back.py), each one op where the
// TensorFlow composition took a dozen over every flat ID of the step:
//   MxrecPackSend       every lookup's (ID, count) pairs into the buffer of the
//                       ID all-to-all (exchange, exchange_all)
//   MxrecSendPositions  each flat ID's row in the buffer of embeddings that
//                       comes back (positions / plan_send_backs)
//   MxrecScatterRows    the owner's embeddings into that buffer (_scatter_out)
//   MxrecGatherSumRows  the gradients that came back, summed into the owned
//                       rows (_gather_grad)
// Kernels live in ../kernels/send_plan_kernels.cc (CPU only).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("MxrecSendPositions")
    .Input("where: N * int32")
    .Input("order: N * int32")
    .Input("index: N * int32")
    .Input("width: int32")
    .Input("offset: int32")
    .Output("position: num_groups * int32")
    .Attr("N: int >= 1")
    .Attr("group_of: list(int) >= 1")
    .Attr("num_groups: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      int n = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      for (int l = 0; l < n; ++l) {
        ShapeHandle where;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(l), 2, &where));
        DimensionHandle unused;
        TF_RETURN_IF_ERROR(c->WithValue(c->Dim(where, 1), 2, &unused));
        ShapeHandle vector;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(n + l), 1, &vector));
        TF_RETURN_IF_ERROR(c->WithRank(c->input(2 * n + l), 1, &vector));
      }
      ShapeHandle vector;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3 * n), 1, &vector));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3 * n + 1), 1, &vector));
      for (int g = 0; g < c->num_outputs(); ++g) c->set_output(g, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Each flat ID's row in the [size * width] buffer of embeddings that comes back,
for N lookups at once. Lookup l's route gives, per unique ID u (sorted by
owner), where[u] = (owner, slot) and its place order[u] among the unique IDs
(a permutation of [0, U)), and per flat ID i the unique ID index[i] in [0, U).
Its rows are

  position_l[i] = owner * width[l] + offset[l] + slot  of the unique ID with
                  order[u] == index[i]

the value of gather(gather(where[:, 0] * width[l] + where[:, 1] + offset[l],
invert_permutation(order)), index). Output g is the concatenation, in
increasing l, of the position_l of the lookups with group_of[l] == g.
A bad route or a row past int32 is an InvalidArgument.
)doc");

REGISTER_OP("MxrecPackSend")
    .Input("where: N * int32")
    .Input("pairs: N * int64")
    .Input("chunks: int32")
    .Output("send: int64")
    .Attr("N: int >= 1")
    .Attr("size: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      int n = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      int64_t size = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("size", &size));
      for (int l = 0; l < n; ++l) {
        ShapeHandle where;
        ShapeHandle pairs;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(l), 2, &where));
        TF_RETURN_IF_ERROR(c->WithRank(c->input(n + l), 2, &pairs));
        DimensionHandle unused;
        TF_RETURN_IF_ERROR(c->Merge(c->Dim(where, 0), c->Dim(pairs, 0), &unused));
      }
      ShapeHandle chunks;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2 * n), 1, &chunks));
      c->set_output(0, c->MakeShape({c->MakeDim(size), c->UnknownDim(), c->MakeDim(2)}));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The buffer of the ID all-to-all, send [size, total, 2] (total = the sum of
chunks): per peer the N lookups' columns concatenated, lookup l's chunks[l]
columns after the earlier lookups'. Zeros, then pairs[l][u] (ID, occurrences)
added at send[owner, offset_l + slot] for where[l][u] = (owner, slot), u in
increasing order; the value of scatter_nd over all lookups' slots. An owner
outside [0, size) or a slot outside [0, chunks[l]) is an InvalidArgument.
)doc");

REGISTER_OP("MxrecScatterRows")
    .Input("emb: T")
    .Input("first: int32")
    .Input("spots: int32")
    .Input("rows: int32")
    .Output("buffer: T")
    .Attr("T: {float, double}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle emb;
      ShapeHandle first;
      ShapeHandle spots;
      ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &emb));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &first));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &spots));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 0, &rows));
      DimensionHandle v;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(first, 0), c->Dim(spots, 0), &v));
      DimensionHandle r;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(3, &r));
      c->set_output(0, c->Matrix(r, c->Dim(emb, 1)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
buffer [rows, dim]: zeros, then buffer[spots[i]] += emb[first[i]] for i in
increasing order; the value of scatter_nd(spots[:, None], gather(emb, first),
[rows, dim]). A first outside [0, M) or a spot outside [0, rows) is an
InvalidArgument.
)doc");

REGISTER_OP("MxrecGatherSumRows")
    .Input("buffer: T")
    .Input("spots: int32")
    .Input("first: int32")
    .Input("owned: int32")
    .Input("scale: T")
    .Output("summed: T")
    .Attr("T: {float, double}")
    .Attr("scaled: bool")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle buffer;
      ShapeHandle spots;
      ShapeHandle first;
      ShapeHandle scalar;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &buffer));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &spots));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &first));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 0, &scalar));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 0, &scalar));
      DimensionHandle v;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(spots, 0), c->Dim(first, 0), &v));
      DimensionHandle m;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(3, &m));
      c->set_output(0, c->Matrix(m, c->Dim(buffer, 1)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
summed [owned, dim]: zeros, then summed[first[i]] += buffer[spots[i]] (times
scale where scaled) for i in increasing order; the value of
unsorted_segment_sum(gather(buffer * scale, spots), first, owned), the same
floats. A spot outside [0, rows of buffer) or a first outside [0, owned) is an
InvalidArgument.
)doc");

}  // namespace tensorflow
