// The reminder stores' shared rules (reminder_support.hpp).

#include "reminder_support.hpp"

#include <chrono>
#include <limits>
#include <random>

namespace troupe::reminders {

Result<void> check_key(std::string_view owner, std::string_view name) {
  if (owner.empty()) return Error(ErrorCode::invalid_argument, "reminder: the owner is empty");
  if (name.empty() || name.size() > kMaxReminderName)
    return Error(ErrorCode::invalid_argument, "reminder: the name must be 1.." + std::to_string(kMaxReminderName) +
                                                  " bytes (got " + std::to_string(name.size()) + ")");
  return {};
}

Result<void> check(const ReminderSpec& spec) {
  if (auto r = check_key(spec.owner, spec.name); !r) return r;
  if (spec.due_ms < 0) return Error(ErrorCode::invalid_argument, "reminder: the due time is negative");
  if (spec.period_ms < 0) return Error(ErrorCode::invalid_argument, "reminder: the period is negative");
  return {};
}

std::int64_t next_due(std::int64_t due_ms, std::int64_t period_ms, std::int64_t fired_ms) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  if (period_ms <= 0) return due_ms;
  const std::int64_t k = fired_ms < due_ms ? 1 : (fired_ms - due_ms) / period_ms + 1;
  if (k > (kMax - due_ms) / period_ms) return kMax;
  return due_ms + k * period_ms;
}

std::int64_t claim_end(std::int64_t now_ms, std::int64_t lease_ms) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  return now_ms > kMax - lease_ms ? kMax : now_ms + lease_ms;
}

Result<void> check_take(std::size_t limit, std::int64_t lease_ms) {
  if (limit == 0) return Error(ErrorCode::invalid_argument, "reminders: take_due with a limit of 0");
  if (lease_ms <= 0) return Error(ErrorCode::invalid_argument, "reminders: take_due with a lease of 0 or less");
  return {};
}

std::uint64_t new_token() {
  static thread_local std::mt19937_64 rng([] {
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
           static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }());
  std::uint64_t t = rng() & 0x7fff'ffff'ffff'ffffull;
  return t == 0 ? 1 : t;
}

Reminder fresh(const ReminderSpec& spec) {
  Reminder r;
  r.owner = spec.owner;
  r.name = spec.name;
  r.due_ms = spec.due_ms;
  r.period_ms = spec.period_ms;
  r.payload = spec.payload;
  r.next_try_ms = spec.due_ms;
  r.token = new_token();
  return r;
}

}  // namespace troupe::reminders
