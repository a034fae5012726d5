#include "troupe/persist/entity.hpp"

#include <cxxabi.h>

#include <algorithm>
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

void ProcessingBoard::enter(const std::string& id, std::int64_t since_ms, std::int64_t deadline_ms) {
  std::lock_guard lk(mu_);
  entries_[id] = {since_ms, deadline_ms};
}

void ProcessingBoard::leave(const std::string& id) {
  std::lock_guard lk(mu_);
  entries_.erase(id);
}

std::size_t ProcessingBoard::size() const {
  std::lock_guard lk(mu_);
  return entries_.size();
}

std::vector<ProcessingEntity> ProcessingBoard::longest(std::size_t limit) const {
  std::vector<ProcessingEntity> out;
  {
    std::lock_guard lk(mu_);
    out.reserve(entries_.size());
    for (const auto& [id, t] : entries_) out.push_back(ProcessingEntity{id, t.first, t.second});
  }
  auto by_age = [](const ProcessingEntity& a, const ProcessingEntity& b) {
    return a.since_ms != b.since_ms ? a.since_ms < b.since_ms : a.id < b.id;
  };
  if (out.size() > limit) {
    std::partial_sort(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(limit), out.end(), by_age);
    out.resize(limit);
  } else {
    std::sort(out.begin(), out.end(), by_age);
  }
  return out;
}

std::optional<ProcessingEntity> ProcessingBoard::find(const std::string& id) const {
  std::lock_guard lk(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return ProcessingEntity{id, it->second.first, it->second.second};
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
