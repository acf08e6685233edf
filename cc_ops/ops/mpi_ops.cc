// Registrations of the exchanges between ranks over MPI (built into
// _mxrec_mpi_ops.so, only where MPI is found). Kernels live in
// ../kernels/mpi_kernels.cc, the exchanges themselves in ../mpi/comm.cc.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("MxrecMpiAlltoallv")
    .Input("data: T")
    .Input("send_counts: int32")
    .Output("received: T")
    .Output("recv_counts: int32")
    .Attr("T: {float, double, int32, int64}")
    .Attr("channel: int")
    .Attr("exchange: string")
    .Attr("timeout_seconds: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle data;
      ShapeHandle counts;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &data));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &counts));
      ShapeHandle rest;
      TF_RETURN_IF_ERROR(c->Subshape(data, 1, &rest));
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(c->UnknownDim()), rest, &out));
      c->set_output(0, out);
      c->set_output(1, counts);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Variable-size all-to-all between the ranks of the MPI job: the first
send_counts[0] rows of `data` go to rank 0, the next send_counts[1] rows to
rank 1, and so on; `received` holds the rows each rank sent here, in rank order,
and recv_counts how many came from each rank. `channel` tags the exchange's
messages (the same on every rank, unique per exchange of a graph); `exchange`
names it in errors. A peer that does not answer within timeout_seconds ends the
op with DeadlineExceeded.
)doc");

REGISTER_OP("MxrecMpiAllreduce")
    .Input("data: T")
    .Output("reduced: T")
    .Attr("T: {float, double, int32, int64}")
    .Attr("reduction: {'sum', 'max', 'min'}")
    .Attr("channel: int")
    .Attr("exchange: string")
    .Attr("timeout_seconds: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Element-wise sum, max or min of `data` over the ranks of the MPI job; every
rank reduces the same buffers in rank order, so every rank gets the same bits.
)doc");

REGISTER_OP("MxrecMpiRanks")
    .Output("rank_and_size: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(2));
      return absl::OkStatus();
    })
    .Doc(R"doc(
[rank, size] of this process in the MPI job (MPI is initialised if needed).
)doc");

}  // namespace tensorflow
