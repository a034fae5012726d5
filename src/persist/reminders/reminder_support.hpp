#pragma once
// What the reminder stores share: checking a ReminderSpec, the next due
// time of a periodic reminder, and new registration tokens. Internal to
// src/persist/reminders.

#include <cstdint>
#include <string>

#include "troupe/persist/reminders.hpp"

namespace troupe::reminders {

// invalid_argument for an empty owner, a name outside 1..128 bytes, a
// negative due time or period.
Result<void> check(const ReminderSpec& spec);
Result<void> check_key(std::string_view owner, std::string_view name);

// The first boundary due_ms + k * period_ms (k >= 1) after fired_ms, so a
// reminder that missed several periods fires once. Saturates at INT64_MAX.
std::int64_t next_due(std::int64_t due_ms, std::int64_t period_ms, std::int64_t fired_ms);

// now_ms + lease_ms, saturating at INT64_MAX: the end of a claim.
std::int64_t claim_end(std::int64_t now_ms, std::int64_t lease_ms);

// invalid_argument unless limit > 0 and lease_ms > 0 (take_due's arguments).
Result<void> check_take(std::size_t limit, std::int64_t lease_ms);

// A token no earlier registration used (random, 1..2^63-1: stored as a
// signed 64-bit number).
std::uint64_t new_token();

// A Reminder for a freshly set spec.
Reminder fresh(const ReminderSpec& spec);

}  // namespace troupe::reminders
