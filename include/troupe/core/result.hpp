#pragma once
// Errors as values.
//
// `Error` is a code plus a human-readable message. `Result<T>` holds either a
// T or an Error; `Result<void>` holds nothing or an Error. Both are plain value
// types: copy/move like their contents, no thread-safety of their own.
// Errors that cross a mailbox travel as these values, never as exceptions.

#include <cassert>
#include <exception>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace troupe {

// Stable error codes. Numbering is part of the wire/journal contract once
// those exist: append new codes, never renumber.
enum class ErrorCode : int {
  ok = 0,
  timeout = 1,          // an ask (or other wait) ran out of time
  mailbox_full = 2,     // the recipient's bounded mailbox refused the message
  dead_letter = 3,      // the recipient had stopped; the message was not delivered
  stash_overflow = 4,   // the actor's stash is at its bound
  no_reply = 5,         // a reply target was dropped without a reply
  shutting_down = 6,    // the actor system no longer takes new work
  invalid_argument = 7, // the caller passed something unusable
  handler_failed = 8,   // a message handler threw
  journal_conflict = 9, // the journal already holds that sequence number: another writer
  journal_failed = 10,  // the journal could not read or write (I/O, closed, full disk)
  corrupt_record = 11,  // a stored row or its bytes cannot be decoded
  recovery_failed = 12, // an entity could not recover its state; it refuses commands
  acquire_timeout = 13, // a keyed lock was not granted within its wait time
  lease_expired = 14,   // a keyed lock's holder ran past its lease; the lock passed on
  buffer_overflow = 15, // a bounded buffer (process manager, job queue) is full; refused at once
  unreachable = 16,     // the node that owns the target is unknown, down or not connected
  not_ready = 17,       // asked before start-up finished (e.g. the first-manager query)
  coordination_failed = 18, // the coordination store (Redis) refused or could not be reached
  protocol_error = 19,  // a peer sent bytes that are not a valid frame or message
  fenced = 20,          // this node lost its lease; it no longer owns the shard or worker
};

std::string_view to_string(ErrorCode code) noexcept;

// A code with a message. Cheap to move; the message is for people.
// An error that stands for a user exception (a lock block, a process, a job
// that threw) also carries the original exception object, so the caller can
// rethrow it as it was thrown.
class Error {
 public:
  Error() = default;
  Error(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  Error(ErrorCode code, std::string message, std::exception_ptr exception)
      : code_(code), message_(std::move(message)), exception_(std::move(exception)) {}

  // handler_failed carrying `e`; the message is `context` + ": " + what().
  static Error from_exception(std::exception_ptr e, std::string_view context);

  ErrorCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }

  // The user exception this error stands for, or null.
  const std::exception_ptr& exception() const noexcept { return exception_; }
  // Rethrows that exception, unchanged, if there is one; otherwise returns.
  void rethrow_if_exception() const {
    if (exception_) std::rethrow_exception(exception_);
  }

  // "timeout: ask to 'counter' got no reply within 100ms"
  std::string to_string() const;

  friend bool operator==(const Error& a, const Error& b) noexcept {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  ErrorCode code_ = ErrorCode::ok;
  std::string message_;
  std::exception_ptr exception_{};
};

// Either a value or an Error. Accessing the wrong side is a programming error:
// asserted in debug builds, std::bad_variant_access otherwise.
template <class T>
class [[nodiscard]] Result {
 public:
  using value_type = T;

  template <class U = T>
    requires std::is_constructible_v<T, U&&> &&
             (!std::is_same_v<std::remove_cvref_t<U>, Result>) &&
             (!std::is_same_v<std::remove_cvref_t<U>, Error>)
  Result(U&& value) : v_(std::in_place_index<0>, std::forward<U>(value)) {}  // NOLINT
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}       // NOLINT

  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  T& value() & { assert(ok()); return std::get<0>(v_); }
  const T& value() const& { assert(ok()); return std::get<0>(v_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const& { assert(!ok()); return std::get<1>(v_); }
  Error&& error() && { assert(!ok()); return std::get<1>(std::move(v_)); }

  template <class U>
  T value_or(U&& fallback) const& {
    return ok() ? value() : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  using value_type = void;
  Result() = default;
  Result(Error error) : error_(std::move(error)) {}  // NOLINT

  bool ok() const noexcept { return error_.code() == ErrorCode::ok; }
  explicit operator bool() const noexcept { return ok(); }
  const Error& error() const& { assert(!ok()); return error_; }
  Error&& error() && { assert(!ok()); return std::move(error_); }

 private:
  Error error_;
};

}  // namespace troupe
