// Translates engine Status into TensorFlow's.
#ifndef MXREC_KERNELS_STATUS_UTIL_H_
#define MXREC_KERNELS_STATUS_UTIL_H_

#include "engine/status.h"
#include "absl/status/status.h"

namespace mxrec {

inline absl::Status ToTfStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return absl::OkStatus();
    case StatusCode::kInvalidArgument:
      return absl::InvalidArgumentError(status.message());
    case StatusCode::kResourceExhausted:
      return absl::ResourceExhaustedError(status.message());
    case StatusCode::kNotFound:
      return absl::NotFoundError(status.message());
    case StatusCode::kInternal:
      break;
  }
  return absl::InternalError(status.message());
}

}  // namespace mxrec

#endif  // MXREC_KERNELS_STATUS_UTIL_H_
