// Translates engine Status into TensorFlow's.
#ifndef MXREC_KERNELS_STATUS_UTIL_H_
#define MXREC_KERNELS_STATUS_UTIL_H_

#include "engine/status.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/status.h"

namespace mxrec {

inline tensorflow::Status ToTfStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return tensorflow::OkStatus();
    case StatusCode::kInvalidArgument:
      return tensorflow::errors::InvalidArgument(status.message());
    case StatusCode::kResourceExhausted:
      return tensorflow::errors::ResourceExhausted(status.message());
    case StatusCode::kNotFound:
      return tensorflow::errors::NotFound(status.message());
    case StatusCode::kInternal:
      break;
  }
  return tensorflow::errors::Internal(status.message());
}

}  // namespace mxrec

#endif  // MXREC_KERNELS_STATUS_UTIL_H_
