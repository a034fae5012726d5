#include "troupe/persist/entity.hpp"

#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>

namespace troupe::detail {

EntityStats EntityCounters::snapshot() const noexcept {
  auto r = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  EntityStats s;
  s.incarnations_started = r(incarnations_started);
  s.active = r(active);
  s.passivations = r(passivations);
  s.recoveries = r(recoveries);
  s.recovery_failures = r(recovery_failures);
  s.events_persisted = r(events_persisted);
  s.snapshots_saved = r(snapshots_saved);
  s.processing_timeouts = r(processing_timeouts);
  s.stale_deadlines = r(stale_deadlines);
  s.stops_deferred = r(stops_deferred);
  s.stash_overflows = r(stash_overflows);
  s.missing_replies = r(missing_replies);
  s.journal_conflicts = r(journal_conflicts);
  s.journal_failures = r(journal_failures);
  s.commands_failed = r(commands_failed);
  s.commands_dropped = r(commands_dropped);
  s.handler_failures = r(handler_failures);
  return s;
}

void EntityCounters::note_processing_timeout(Duration d) noexcept {
  std::int64_t ns = d.count();
  std::int64_t cur = longest_processing_ns.load(std::memory_order_relaxed);
  while (ns > cur && !longest_processing_ns.compare_exchange_weak(cur, ns, std::memory_order_relaxed)) {
  }
}

void entity_log(const std::string& type_name, std::string_view id, std::string_view what) {
  std::fprintf(stderr, "troupe: entity '%s|%.*s': %.*s\n", type_name.c_str(), static_cast<int>(id.size()), id.data(),
               static_cast<int>(what.size()), what.data());
}

std::string demangle(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  if (status != 0 || !d) return mangled;
  std::string out(d);
  std::free(d);  // NOLINT: __cxa_demangle allocates with malloc
  return out;
}

std::int64_t wall_ms(WallTime t) noexcept {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

}  // namespace troupe::detail
