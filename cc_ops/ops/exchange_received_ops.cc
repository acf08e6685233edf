// Registration of MxrecExchangeReceived: the owner's side of the fused ID
// exchange (mxrec.distributed.id_exchange.exchange_all) in one op, in place of
// TensorFlow's where, floordiv/floormod, repeat, gathers, stable argsort and
// segment sum over the received slots. The kernel lives in
// ../kernels/exchange_received_kernels.cc (CPU only).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("MxrecExchangeReceived")
    .Input("received: int64")
    .Input("chunks: int32")
    .Output("pairs: int64")
    .Output("lookup: int32")
    .Output("peer: int32")
    .Output("valid: int32")
    .Output("per_lookup: int32")
    .Attr("size: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle received;
      ShapeHandle chunks;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &received));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &chunks));
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(received, 1), 2, &unused));
      // V, the filled slots, is known only when the op runs.
      const DimensionHandle v = c->UnknownDim();
      c->set_output(0, c->Matrix(v, 2));
      c->set_output(1, c->Vector(v));
      c->set_output(2, c->Vector(v));
      c->set_output(3, c->Vector(v));
      c->set_output(4, c->Vector(c->Dim(chunks, 0)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Groups the received slots of a fused ID all-to-all by lookup. received [R, 2]
holds (ID, occurrences) per slot, laid out per peer (size peers) as the L
lookups' columns concatenated: lookup l has chunks[l] columns per peer,
starting at column offsets[l] = chunks[0] + ... + chunks[l - 1]; R must be
size * total, total = the sum of chunks (at most 2^31 - 1 slots). A slot is
filled when its occurrences are > 0, empty when 0; a negative count is an
error.

pairs: [V, 2], the (ID, occurrences) of the V filled slots, grouped by lookup;
  within a lookup in slot order (peer, then column).
lookup: [V], the lookup of each row of pairs.
peer: [V], the peer the row's slot came from.
valid: [V], the row's slot within its lookup's own [size * chunk] buffer:
  peer * chunks[lookup] + column - offsets[lookup].
per_lookup: [L], filled slots per lookup.
)doc");

}  // namespace tensorflow
