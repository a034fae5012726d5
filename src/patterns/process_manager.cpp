// The non-template parts of the process manager: settings validation, the
// texts of its errors, and the metrics snapshot.

#include "troupe/patterns/process_manager.hpp"

#include <cmath>
#include <limits>
#include <string>

namespace troupe::detail {

namespace {

// Below this a start interval no longer fits in a Duration (int64 ns).
constexpr double kMinStartsPerSecond = 1e-9;

}  // namespace

Result<void> validate_process_manager(const std::string& name, std::size_t max_running, std::size_t buffer,
                                      double starts_per_second, std::size_t burst) {
  auto bad = [&](const std::string& what) {
    return Error(ErrorCode::invalid_argument, "process manager '" + name + "': " + what);
  };
  if (name.empty()) return Error(ErrorCode::invalid_argument, "process manager: name is empty");
  if (max_running == 0) return bad("max_running is 0; at least one process must be allowed to run");
  if (buffer > std::numeric_limits<std::size_t>::max() - max_running)
    return bad("max_running + buffer overflows (max_running " + std::to_string(max_running) + ", buffer " +
               std::to_string(buffer) + ")");
  if (std::isnan(starts_per_second)) return bad("starts_per_second is NaN");
  if (std::isinf(starts_per_second)) return bad("starts_per_second is infinite; use 0 for no throttle");
  if (starts_per_second < 0)
    return bad("starts_per_second is negative (" + std::to_string(starts_per_second) +
               "); use 0 for no throttle");
  if (starts_per_second > 0 && starts_per_second < kMinStartsPerSecond)
    return bad("starts_per_second " + std::to_string(starts_per_second) +
               " is below the smallest rate, 1e-9");
  if (starts_per_second > 0 && burst == 0)
    return bad("burst is 0 with a throttle: no process could ever start");
  return {};
}

Duration process_start_interval(double starts_per_second) noexcept {
  double ns = std::ceil(1e9 / starts_per_second);
  if (!(ns >= 1)) ns = 1;
  constexpr auto kMax = static_cast<double>(std::numeric_limits<Duration::rep>::max() / 4);
  if (ns > kMax) ns = kMax;
  return Duration(static_cast<Duration::rep>(ns));
}

std::string process_overflow_message(const std::string& name, std::size_t max_running, std::size_t buffer) {
  return "process manager '" + name + "' is full: " + std::to_string(max_running) +
         " running (max_running) and " + std::to_string(buffer) + " waiting (buffer); request refused";
}

Error process_ended_error(const std::string& process, ExitReason reason, const std::string& detail,
                          const std::exception_ptr& thrown) {
  switch (reason) {
    case ExitReason::failure:
      // `detail` is the runtime's text (the exception's what(), or why a
      // restart gave up); `thrown`, if the shell caught it, the object.
      return Error(
          ErrorCode::handler_failed,
          "process '" + process + "' failed: " + (detail.empty() ? std::string("unknown failure") : detail),
          thrown);
    case ExitReason::shutdown:
      return Error(ErrorCode::shutting_down,
                   "process '" + process + "' was stopped by the actor system's shutdown before completing");
    case ExitReason::normal:
      break;
  }
  return Error(ErrorCode::no_reply, "process '" + process + "' stopped without completing");
}

ProcessStats ProcessCounters::snapshot() const noexcept {
  auto get = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  ProcessStats s;
  s.running = get(running);
  s.buffered = get(buffered);
  s.outstanding = get(outstanding);
  s.accepted = get(accepted);
  s.refused = get(refused);
  s.completed = get(completed);
  s.failed = get(failed);
  s.cancelled = get(cancelled);
  s.peak_running = get(peak_running);
  s.peak_buffered = get(peak_buffered);
  return s;
}

}  // namespace troupe::detail
