#pragma once
// Runs a read model's transaction body, turning an exception it throws into
// journal_failed naming it, so the caller rolls back and the page is tried
// again. Internal to the read models.

#include <exception>
#include <functional>
#include <string>

#include "troupe/core/result.hpp"

namespace troupe::detail {

inline Result<void> guarded_body(const std::function<Result<void>()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return Error(ErrorCode::journal_failed, std::string("the read model's handler threw: ") + e.what());
  } catch (...) {
    return Error(ErrorCode::journal_failed, "the read model's handler threw something not an exception");
  }
}

}  // namespace troupe::detail
