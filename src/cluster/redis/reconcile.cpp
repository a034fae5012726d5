// Running what Redis places on this node: serve() registers a group's
// Reconciler; each reconcile reads this node's units of the group and
// starts, updates and stops units to match, releasing a hand-off once a
// unit moved away has stopped.

#include "coordinator_impl.hpp"

namespace troupe::cluster {

// --- reconcile ------------------------------------------------------------------------

Result<void> Coordinator::Impl::serve(const std::string& group, Reconciler reconciler) {
  if (auto v = validate_group(group); !v.ok()) return v;
  if (halting_.load(std::memory_order_acquire)) return shutting_down_error();
  {
    std::lock_guard lk(view_mu_);
    if (!served_names_.insert(group).second)
      return Error(ErrorCode::invalid_argument, "group '" + group + "' is already served on this node");
  }
  asio::post(io_, [this, group, reconciler = std::move(reconciler)]() mutable {
    if (halted_) return;
    served_.emplace(group, ServedGroup{std::move(reconciler), {}, false, false, {}, {}});
    reconcile(group);
  });
  return {};
}

void Coordinator::Impl::reconcile_all() {
  for (auto& [group, g] : served_) reconcile(group);
}

void Coordinator::Impl::reconcile(const std::string& group) {
  auto it = served_.find(group);
  if (it == served_.end()) return;
  if (halted_ || phase_ != Phase::running || fenced_ || !link_up_ || !registered_) return;
  ServedGroup& g = it->second;
  if (g.in_flight) {
    g.dirty = true;
    return;
  }
  g.in_flight = true;
  g.dirty = false;
  eval(Script::my_units, {group, s_.node_id}, [this, group](Reply r) {
    auto git = served_.find(group);
    if (git == served_.end() || halted_) return;
    git->second.in_flight = false;
    if (!r.ok()) {
      log(CoordinatorLogLevel::debug,
          "reading this node's units of '" + group + "' failed: " + r.error().message());
    } else if (r->elements[0].str == "NO_CONFIG") {
      // Redis lost its data; the next heartbeat finds this node gone and
      // registers it again.
      log(CoordinatorLogLevel::debug,
          "the cluster settings are missing in Redis; waiting for the next heartbeat");
    } else if (r->elements[0].str != "OK" || r->elements.size() != 3 || !r->elements[2].is_array()) {
      (void)unexpected(Script::my_units, *r);
    } else {
      apply(group, r->elements[2]);
    }
    if (git->second.dirty) reconcile(group);
  });
}

void Coordinator::Impl::apply(const std::string& group, const RedisReply& units) {
  if (phase_ != Phase::running || fenced_) return;
  ServedGroup& g = served_.at(group);
  struct Want {
    std::string spec;
    std::uint64_t epoch;
    std::string waiting_for;
  };
  std::map<std::string, Want> want;
  for (const auto& u : units.elements) {
    std::string unit, spec, wait_for;
    long long e = 0, we = 0;
    if (!u.is_array() || u.elements.size() != 5 || !text_of(u.elements[0], unit) ||
        !int_of(u.elements[1], e) || !text_of(u.elements[2], spec) || !text_of(u.elements[3], wait_for) ||
        !int_of(u.elements[4], we) || !validate_unit(unit).ok()) {
      std::string key = "unit entry " + u.describe();
      if (warned_entries_.insert(key).second)
        log(CoordinatorLogLevel::warning,
            "skipping a malformed unit entry of '" + group + "': " + u.describe());
      continue;
    }
    note_epoch(static_cast<std::uint64_t>(e));
    want.emplace(std::move(unit), Want{std::move(spec), static_cast<std::uint64_t>(e), std::move(wait_for)});
  }
  // Stop what is no longer ours, or ours under another epoch (it moved away
  // and back: whatever ran under the old epoch must end first).
  std::vector<std::string> to_stop;
  for (auto& [unit, lu] : g.units) {
    if (lu.stopping) continue;
    auto w = want.find(unit);
    if (w == want.end() || w->second.epoch != lu.epoch) {
      to_stop.push_back(unit);
    } else if (w->second.spec != lu.spec) {
      lu.spec = w->second.spec;
      if (g.reconciler.update) {
        try {
          g.reconciler.update(unit, lu.spec, lu.epoch);
        } catch (const std::exception& ex) {
          log(CoordinatorLogLevel::error, "Reconciler::update of '" + unit + "' threw: " + ex.what());
        } catch (...) {
          log(CoordinatorLogLevel::error, "Reconciler::update of '" + unit + "' threw");
        }
      }
    }
  }
  for (const auto& unit : to_stop) begin_stop(group, unit, /*release_after=*/true);
  g.awaited.clear();
  g.restart.clear();
  std::vector<std::pair<std::string, std::uint64_t>> started;
  for (auto& [unit, w] : want) {
    auto running = g.units.find(unit);
    if (running != g.units.end()) {
      // Running, or stopping: started again once stopped.
      if (running->second.stopping) g.restart.insert(unit);
      continue;
    }
    if (hand_off_ && hand_off_->marked) {
      // Placed here while this node hands its units off: moved on, never
      // started.
      queue_hand_off(group, unit, w.epoch, false);
      continue;
    }
    if (!w.waiting_for.empty()) {
      g.awaited.insert(unit);
      continue;
    }
    g.units.emplace(unit, LocalUnit{w.spec, w.epoch, false, false});
    started.emplace_back(unit, w.epoch);
    if (g.reconciler.start) {
      try {
        g.reconciler.start(unit, w.spec, w.epoch);
      } catch (const std::exception& ex) {
        log(CoordinatorLogLevel::error, "Reconciler::start of '" + unit + "' threw: " + ex.what());
      } catch (...) {
        log(CoordinatorLogLevel::error, "Reconciler::start of '" + unit + "' threw");
      }
    }
  }
  if (!started.empty()) publish_started(group, started);
  if (hand_off_) pump_hand_off();
}

void Coordinator::Impl::begin_stop(const std::string& group, const std::string& unit, bool release_after) {
  ServedGroup& g = served_.at(group);
  auto it = g.units.find(unit);
  if (it == g.units.end() || it->second.stopping) return;
  it->second.stopping = true;
  it->second.release_after = release_after;
  std::uint64_t epoch = it->second.epoch;
  Future<void> f = [&]() -> Future<void> {
    if (g.reconciler.stop) {
      try {
        return g.reconciler.stop(unit);
      } catch (const std::exception& ex) {
        log(CoordinatorLogLevel::error, "Reconciler::stop of '" + unit + "' threw: " + ex.what());
      } catch (...) {
        log(CoordinatorLogLevel::error, "Reconciler::stop of '" + unit + "' threw");
      }
    }
    Promise<void> done;
    done.set_value();
    return done.future();
  }();
  std::weak_ptr<Impl> weak = weak_from_this();
  std::move(f).then([weak, group, unit, epoch](Result<void> r) {
    auto self = weak.lock();
    if (!self) return;
    Impl* raw = self.get();
    asio::post(raw->io_, [raw, group, unit, epoch, r = std::move(r)] {
      if (!raw->halted_) raw->on_stopped(group, unit, epoch, r);
    });
  });
}

void Coordinator::Impl::on_stopped(const std::string& group, const std::string& unit, std::uint64_t epoch,
                                   const Result<void>& r) {
  ServedGroup& g = served_.at(group);
  auto it = g.units.find(unit);
  if (it == g.units.end() || !it->second.stopping || it->second.epoch != epoch) return;
  bool release_after = it->second.release_after;
  g.units.erase(it);
  if (!r.ok())
    log(CoordinatorLogLevel::warning, "Reconciler::stop of '" + unit + "' failed: " + r.error().message());
  publish_stopped(group, unit);
  if (release_after || fenced_) {
    if (fenced_ || !link_up_) {
      pending_releases_.push_back({group, unit, epoch});
    } else {
      do_release(group, unit, epoch, [](Result<bool>) {});
    }
  }
  note_handed_off(group, unit);
  if (phase_ == Phase::stopping) {
    maybe_finish_stop();
    return;
  }
  // Only a unit placed here again needs a read to start; a unit that moved
  // away has nothing more to do here.
  if (g.restart.erase(unit) != 0) reconcile(group);
}

// The running view changes by the units that changed, never by a copy of
// the group: a rebalance stops thousands of units one at a time.
void Coordinator::Impl::publish_started(const std::string& group,
                                        const std::vector<std::pair<std::string, std::uint64_t>>& units) {
  std::lock_guard lk(view_mu_);
  auto& view = running_view_[group];
  for (const auto& [unit, epoch] : units) view[unit] = epoch;
}

void Coordinator::Impl::publish_stopped(const std::string& group, const std::string& unit) {
  std::lock_guard lk(view_mu_);
  auto it = running_view_.find(group);
  if (it != running_view_.end()) it->second.erase(unit);
}

}  // namespace troupe::cluster
