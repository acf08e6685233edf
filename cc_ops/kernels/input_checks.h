// Shape checks of op inputs, made before a kernel reads them: a wrong shape is
// an InvalidArgument naming the table, the op and the input, never a CHECK
// failure inside Tensor::scalar or a read past a buffer. (Shape functions do
// not run on inputs whose shape is known only when the graph runs.)
#ifndef MXREC_KERNELS_INPUT_CHECKS_H_
#define MXREC_KERNELS_INPUT_CHECKS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

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

}  // namespace mxrec

#endif  // MXREC_KERNELS_INPUT_CHECKS_H_
