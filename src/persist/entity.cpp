#include "troupe/persist/entity.hpp"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>

#include "troupe/core/log.hpp"

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
  if (!log::enabled(log::Component::persist, log::Level::warn)) return;
  log::warn(log::Component::persist, what, {{"entity", type_name + "|" + std::string(id)}});
}

void entity_note(const std::string& type_name, std::string_view id, std::string_view what, std::int64_t ms_field) {
  if (!log::enabled(log::Component::persist, log::Level::info)) return;
  const std::string entity = type_name + "|" + std::string(id);
  if (ms_field >= 0) {
    log::info(log::Component::persist, what, {{"entity", entity}, {"timeout_ms", ms_field}});
  } else {
    log::info(log::Component::persist, what, {{"entity", entity}});
  }
}

TraceRef stored_trace(const std::string& trace_id) {
  if (trace_id.empty()) return {};
  auto id = TraceId::from_hex(trace_id);
  if (!id) return {};
  TraceContext c;
  c.trace_id = *id;
  c.flags = 1;
  return TraceRef::make(c);
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

Result<void> check_registry_settings(EntitySettings& settings, bool has_journal, bool has_codecs,
                                     bool has_state_codec, bool can_build_behaviour, std::size_t threads) {
  auto bad = [](std::string m) { return Error(ErrorCode::invalid_argument, std::move(m)); };
  if (settings.type_name.empty()) return bad("entity type name is empty");
  if (settings.type_name.find('|') != std::string::npos)
    return bad("entity type name '" + settings.type_name + "' contains '|'");
  if (!has_journal) return bad("entity type '" + settings.type_name + "': no journal");
  if (!has_codecs) return bad("entity type '" + settings.type_name + "': no event codecs registered");
  if (settings.stash_capacity == 0) return bad("entity type '" + settings.type_name + "': stash capacity is 0");
  if (settings.snapshot_every && !has_state_codec)
    return bad("entity type '" + settings.type_name + "': snapshot_every needs a state codec");
  if (!can_build_behaviour)
    return bad("entity type '" + settings.type_name + "': no factory and the behaviour has no default constructor");
  if (settings.idle_timeout < Duration::zero()) settings.idle_timeout = Duration::zero();
  if (settings.shards == 0) settings.shards = 8 * std::max<std::size_t>(1, threads);
  return {};
}

std::optional<bool> RegistryStop::begin(bool immediate) {
  std::lock_guard lk(mu_);
  if (begun_ && (!immediate || immediate_)) return std::nullopt;
  bool first = !begun_;
  begun_ = true;
  immediate_ = immediate_ || immediate;
  return first;
}

void RegistryStop::shard_stopped(std::size_t shards) {
  std::vector<std::function<void()>> run;
  {
    std::lock_guard lk(mu_);
    ++stopped_;
    cv_.notify_all();
    if (stopped_ == shards) run.swap(callbacks_);
  }
  for (auto& f : run) f();
}

bool RegistryStop::wait_stopped(std::chrono::steady_clock::duration bound, std::size_t shards) {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, bound, [&] { return stopped_ == shards; });
}

void RegistryStop::when_stopped(std::function<void()> f, std::size_t shards) {
  {
    std::lock_guard lk(mu_);
    if (stopped_ < shards) {
      callbacks_.push_back(std::move(f));
      return;
    }
  }
  f();
}

Duration graceful_stop_bound(const EntitySettings& settings, const EntityCounters& counters) noexcept {
  if (settings.stop_timeout > Duration::zero()) return settings.stop_timeout;
  return Duration(counters.longest_processing_ns.load(std::memory_order_relaxed)) + std::chrono::seconds(1);
}

}  // namespace troupe::detail
