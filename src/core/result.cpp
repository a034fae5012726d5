#include "troupe/core/result.hpp"

#include "troupe/core/detail/cell.hpp"

namespace troupe {

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::ok: return "ok";
    case ErrorCode::timeout: return "timeout";
    case ErrorCode::mailbox_full: return "mailbox_full";
    case ErrorCode::dead_letter: return "dead_letter";
    case ErrorCode::stash_overflow: return "stash_overflow";
    case ErrorCode::no_reply: return "no_reply";
    case ErrorCode::shutting_down: return "shutting_down";
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::handler_failed: return "handler_failed";
    case ErrorCode::journal_conflict: return "journal_conflict";
    case ErrorCode::journal_failed: return "journal_failed";
    case ErrorCode::corrupt_record: return "corrupt_record";
    case ErrorCode::recovery_failed: return "recovery_failed";
    case ErrorCode::acquire_timeout: return "acquire_timeout";
    case ErrorCode::lease_expired: return "lease_expired";
    case ErrorCode::buffer_overflow: return "buffer_overflow";
    case ErrorCode::unreachable: return "unreachable";
    case ErrorCode::not_ready: return "not_ready";
    case ErrorCode::coordination_failed: return "coordination_failed";
    case ErrorCode::protocol_error: return "protocol_error";
    case ErrorCode::fenced: return "fenced";
  }
  return "unknown";
}

Error Error::from_exception(std::exception_ptr e, std::string_view context) {
  std::string msg(context);
  try {
    if (e) std::rethrow_exception(e);
    msg += ": no exception";
  } catch (const std::exception& ex) {
    msg += ": ";
    msg += ex.what();
  } catch (...) {
    msg += ": a non-standard exception";
  }
  return Error(ErrorCode::handler_failed, std::move(msg), std::move(e));
}

std::string Error::to_string() const {
  std::string s(troupe::to_string(code_));
  if (!message_.empty()) {
    s += ": ";
    s += message_;
  }
  return s;
}

std::string_view to_string(Delivery d) noexcept {
  switch (d) {
    case Delivery::delivered: return "delivered";
    case Delivery::mailbox_full: return "mailbox_full";
    case Delivery::dead_letter: return "dead_letter";
  }
  return "unknown";
}

std::string_view to_string(ExitReason r) noexcept {
  switch (r) {
    case ExitReason::normal: return "normal";
    case ExitReason::failure: return "failure";
    case ExitReason::shutdown: return "shutdown";
  }
  return "unknown";
}

}  // namespace troupe
