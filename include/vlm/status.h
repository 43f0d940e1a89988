// vlm public API: error reporting.
// Every fallible call returns a Status (or Result<T>); nothing in the library aborts on user input.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace vlm {

enum class StatusCode {
  kOk,
  kInvalidArgument,    // bad user input: flags, ids, request fields
  kNotFound,           // missing file or tensor
  kDataLoss,           // corrupt or truncated file
  kOutOfRange,         // e.g. prompt longer than the context
  kResourceExhausted,  // a request queue is full (the server's 429)
  kUnavailable,        // out of memory or cache right now; retrying later may work (503)
  kUnimplemented,
  kInternal,
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // The request field the error is about ("messages", "max_thinking_tokens"; "" when none): what
  // the OpenAI API reports as the error's param.
  const std::string& field() const { return field_; }

  // Returns a copy whose message is "context: message" (errors gain context as they rise); the
  // field stays.
  Status with_context(const std::string& context) const {
    if (ok()) return *this;
    Status s(code_, context + ": " + message_);
    s.field_ = field_;
    return s;
  }
  // Returns a copy that names the request field at fault.
  Status with_field(std::string field) const {
    Status s = *this;
    s.field_ = std::move(field);
    return s;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  std::string field_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Either a value or a non-ok Status.
template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  // The error with `context` in front (as Status::with_context); a value passes through.
  Result with_context(const std::string& context) && {
    if (ok()) return std::move(*this);
    return std::get<Status>(v_).with_context(context);
  }

 private:
  std::variant<T, Status> v_;
};

}  // namespace vlm

// Propagation helpers (control flow stays visible: they only return).
#define VLM_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::vlm::Status vlm_status_ = (expr);        \
    if (!vlm_status_.ok()) return vlm_status_; \
  } while (0)

#define VLM_CONCAT_INNER_(a, b) a##b
#define VLM_CONCAT_(a, b) VLM_CONCAT_INNER_(a, b)
#define VLM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
#define VLM_ASSIGN_OR_RETURN(lhs, expr) \
  VLM_ASSIGN_OR_RETURN_IMPL_(VLM_CONCAT_(vlm_result_, __LINE__), lhs, expr)
