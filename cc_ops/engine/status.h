// Status and check helpers of the host engine. The engine has no TensorFlow
// types, so it reports errors through this small Status, and the op kernels
// translate it into tensorflow::errors.
#ifndef MXREC_ENGINE_STATUS_H_
#define MXREC_ENGINE_STATUS_H_

#include <sstream>
#include <string>
#include <utility>

namespace mxrec {

enum class StatusCode { kOk = 0, kInvalidArgument, kResourceExhausted, kNotFound, kInternal };

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

namespace internal {
template <typename... Args>
std::string StrCat(Args&&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace internal

}  // namespace mxrec

// Builds a Status whose message ends with the source location, so that an
// error reported far from Python still says where it was raised.
#define MXREC_ERROR(code, ...)                                                       \
  ::mxrec::Status(code, ::mxrec::internal::StrCat(__VA_ARGS__, " [", __FILE__, ":", \
                                                  __LINE__, "]"))

#define MXREC_RETURN_IF_ERROR(expr)      \
  do {                                   \
    ::mxrec::Status _mxrec_status = (expr); \
    if (!_mxrec_status.ok()) return _mxrec_status; \
  } while (0)

#endif  // MXREC_ENGINE_STATUS_H_
