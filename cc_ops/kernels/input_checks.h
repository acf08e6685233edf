// Shape checks of op inputs, made before a kernel reads them, and outputs sized
// by inputs: a wrong shape or an impossible size is an InvalidArgument naming
// the op and the input, never a CHECK failure inside Tensor::scalar or
// TensorShape, or a read past a buffer. (Shape functions do not run on inputs
// whose shape is known only when the graph runs, nor on eager calls.)
#ifndef MXREC_KERNELS_INPUT_CHECKS_H_
#define MXREC_KERNELS_INPUT_CHECKS_H_

#include <unistd.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace mxrec {

// InvalidArgument unless the input `input` of `kernel` has rank `rank`.
inline absl::Status CheckInputRank(const tensorflow::OpKernel& kernel, const std::string& table,
                                   const char* input, const tensorflow::Tensor& tensor,
                                   int rank) {
  if (tensor.dims() == rank) return absl::OkStatus();
  const std::string want = rank == 0   ? std::string("a scalar")
                           : rank == 1 ? std::string("a vector")
                                       : absl::StrCat("of rank ", rank);
  return absl::InvalidArgumentError(absl::StrCat("mxrec table '", table, "': ",
                                                 kernel.type_string(), " input '", input,
                                                 "' must be ", want, ", got shape ",
                                                 tensor.shape().DebugString()));
}

// InvalidArgument unless dimension `axis` of the input `input` is `size`
// (`of`: what the size is taken from, for the message).
inline absl::Status CheckInputDim(const tensorflow::OpKernel& kernel, const std::string& table,
                                  const char* input, const tensorflow::Tensor& tensor, int axis,
                                  int64_t size, const std::string& of) {
  if (tensor.dims() > axis && tensor.dim_size(axis) == size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "mxrec table '", table, "': ", kernel.type_string(), " input '", input,
      "' must have ", size, " (", of, ") in dimension ", axis, ", got shape ",
      tensor.shape().DebugString()));
}

// The bytes of memory of this host (0 when unknown): no tensor larger can be
// allocated, and asking the allocator for one could only fail or swap.
inline int64_t HostMemoryBytes() {
  static const int64_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGESIZE);
    return pages > 0 && page_size > 0 ? static_cast<int64_t>(pages) * page_size : int64_t{0};
  }();
  return bytes;
}

// Allocates output `index` (named `output`) of the shape `dims`, whose sizes
// come from the op's inputs or attributes (`sized_by`, e.g. "num_unique = 7,
// grad's dim 4"). A negative size, more than 2^63 - 1 values (where
// TensorShape would abort) or more bytes than this host's memory is an
// InvalidArgument naming the op, the output, the shape and `sized_by`.
inline absl::Status AllocateSizedOutput(tensorflow::OpKernelContext* ctx, int index,
                                        const char* output, absl::Span<const int64_t> dims,
                                        const std::string& sized_by, tensorflow::Tensor** out) {
  const tensorflow::OpKernel& kernel = ctx->op_kernel();
  const auto invalid = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        kernel.type_string(), " (", kernel.name(), "): output '", output, "' of shape [",
        absl::StrJoin(dims, ", "), "] (", sized_by, ") ", why));
  };
  for (const int64_t size : dims) {
    if (size < 0) return invalid("has a negative size");
  }
  tensorflow::TensorShape shape;
  if (!tensorflow::TensorShape::BuildTensorShape(dims, &shape).ok()) {
    return invalid("would hold more than 2^63 - 1 values");
  }
  const int64_t value_bytes = tensorflow::DataTypeSize(kernel.output_type(index));
  const int64_t memory = HostMemoryBytes();
  if (memory > 0 && value_bytes > 0 && shape.num_elements() > memory / value_bytes) {
    return invalid(absl::StrCat("would take ", shape.num_elements(), " x ", value_bytes,
                                " bytes, more than this host's ", memory, " bytes of memory"));
  }
  return ctx->allocate_output(index, shape, out);
}

}  // namespace mxrec

#endif  // MXREC_KERNELS_INPUT_CHECKS_H_
