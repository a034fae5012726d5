// Self-fencing: a node whose last successful heartbeat was sent
// liveness_threshold ago stops every unit (on_fenced) before anyone may take
// them, and resumes (on_unfenced) once a registration succeeds again.

#include "coordinator_impl.hpp"

namespace troupe::cluster {

// --- fencing ----------------------------------------------------------------------

void Coordinator::Impl::arm_fence_timer() {
  fence_timer_.expires_at(to_asio(last_ok_send_ + s_.liveness_threshold));
  fence_timer_.async_wait([this](const asio::error_code& ec) {
    if (ec || halted_ || fenced_) return;
    if (phase_ != Phase::running && phase_ != Phase::stopping) return;
    if (steady_now() < last_ok_send_ + s_.liveness_threshold) {
      arm_fence_timer();
      return;
    }
    fence("no heartbeat sent in the last " + ms_text(s_.liveness_threshold) + " succeeded");
  });
}

void Coordinator::Impl::fence(const std::string& why) {
  if (fenced_) return;
  fenced_ = true;
  log(CoordinatorLogLevel::warning, "fenced: " + why + "; stopping every unit");
  if (s_.on_fenced) {
    try {
      s_.on_fenced();
    } catch (...) {
      log(CoordinatorLogLevel::error, "on_fenced threw");
    }
  }
  for (auto& [group, g] : served_) {
    std::vector<std::string> names;
    for (auto& [unit, u] : g.units)
      if (!u.stopping) names.push_back(unit);
    for (const auto& unit : names) begin_stop(group, unit, /*release_after=*/false);
  }
  // Seen from other threads only now: a node that reports itself fenced
  // has asked every unit to stop.
  fenced_flag_.store(true, std::memory_order_release);
}

void Coordinator::Impl::unfence() {
  if (superseded_) return;
  fenced_ = false;
  fenced_flag_.store(false, std::memory_order_release);
  log(CoordinatorLogLevel::info, "unfenced: heartbeats succeed again; registered anew");
  if (s_.on_unfenced) {
    try {
      s_.on_unfenced();
    } catch (...) {
      log(CoordinatorLogLevel::error, "on_unfenced threw");
    }
  }
  // Units stopped while fenced may carry a hand-off from this node that
  // nobody else can clear while it is live again.
  for (const auto& pr : pending_releases_) do_release(pr.group, pr.unit, pr.epoch, [](Result<bool>) {});
  pending_releases_.clear();
  // Handing its units off still: a takeover meanwhile removed the member,
  // and its draining mark with it. Marked again before anything is
  // placed here anew.
  if (hand_off_ && hand_off_->marked) eval(Script::drain, {s_.node_id, session_}, [](Reply) {});
  reconcile_all();
}

}  // namespace troupe::cluster
