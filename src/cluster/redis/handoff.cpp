// The planned hand-off (Coordinator::hand_off), the first half of a
// graceful leave: this member is marked as draining in Redis, so nothing
// new is placed on it, and its units move a batch at a time. For each unit
// the new owner is chosen first (the relocate script, which records that
// the new owner waits for this node's release); only then is the unit
// stopped here and released, and the new owner starts it. Meanwhile the
// member stays live: it keeps its heartbeat, answers lookups and forwards
// what still reaches it.

#include "coordinator_impl.hpp"

namespace troupe::cluster {

namespace {
// How often a relocation that met no Redis is tried before its unit is
// kept here (the leave script then keeps it too, and a later member takes
// it over).
constexpr int kHandOffTries = 5;
}  // namespace

Future<HandOffReport> Coordinator::Impl::hand_off(std::size_t batch,
                                                  std::function<void(const HandOffReport&)> progress) {
  return call<HandOffReport>([this, batch, progress = std::move(progress)](Promise<HandOffReport>& p) mutable {
    if (batch == 0) return p.set_error(Error(ErrorCode::invalid_argument, "hand_off: batch must be at least 1"));
    if (phase_ == Phase::stopping || phase_ == Phase::stopped) return p.set_error(shutting_down_error());
    if (phase_ != Phase::running)
      return p.set_error(Error(ErrorCode::not_ready, "hand_off() asked before start-up finished on node '" +
                                                         s_.node_id + "'"));
    if (hand_off_) {
      if (hand_off_->done) return p.set_value(hand_off_->report);
      hand_off_->waiters.push_back(std::move(p));
      return;
    }
    if (fenced_ || !link_up_ || !registered_)
      return p.set_error(Error(ErrorCode::coordination_failed,
                               "node '" + s_.node_id + "' cannot hand its units off: " +
                                   (fenced_ ? std::string("it is fenced") : not_connected_error().message())));
    hand_off_.emplace();
    hand_off_->batch = batch;
    hand_off_->progress = std::move(progress);
    hand_off_->began = steady_now();
    hand_off_->waiters.push_back(std::move(p));
    eval(Script::drain, {s_.node_id, session_}, [this](Reply r) {
      if (halted_ || !hand_off_) return;
      if (!r.ok()) return end_hand_off(r.error());
      if (r->elements[0].str != "OK") {
        return end_hand_off(Error(ErrorCode::coordination_failed,
                                  "node '" + s_.node_id + "' is no longer a member (" + r->elements[0].str +
                                      "): nothing to hand off"));
      }
      hand_off_->marked = true;
      for (auto& [group, g] : served_)
        for (auto& [unit, lu] : g.units)
          if (!lu.stopping) queue_hand_off(group, unit, lu.epoch, true);
      log(CoordinatorLogLevel::info, "handing off " + std::to_string(hand_off_->report.units) + " units, " +
                                         std::to_string(hand_off_->batch) + " at a time");
      pump_hand_off();
      maybe_finish_hand_off();
    });
  });
}

void Coordinator::Impl::queue_hand_off(const std::string& group, const std::string& unit, std::uint64_t epoch,
                                       bool running) {
  if (!hand_off_ || !hand_off_->marked) return;
  if (!hand_off_->queued.insert({group, unit}).second) return;
  hand_off_->done = false;
  hand_off_->queue.push_back(HandOff::Queued{group, unit, epoch, running});
  ++hand_off_->report.units;
}

void Coordinator::Impl::pump_hand_off() {
  HandOff& h = *hand_off_;
  while (!h.queue.empty() && h.relocating + h.stopping.size() < h.batch) {
    HandOff::Queued q = std::move(h.queue.front());
    h.queue.pop_front();
    if (q.running) {
      auto& units = served_.at(q.group).units;
      auto it = units.find(q.unit);
      if (it == units.end() || it->second.stopping) {
        // Stopped or stopping meanwhile (moved by someone else, whose new
        // owner waits for this node's release): not this hand-off's.
        h.queued.erase({q.group, q.unit});
        --h.report.units;
        continue;
      }
    }
    ++h.relocating;
    std::string group = q.group, unit = q.unit;
    do_relocate(group, unit, /*force=*/true,
                [this, q = std::move(q)](Result<Placement> r) mutable { on_relocated(std::move(q), std::move(r)); });
  }
}

void Coordinator::Impl::on_relocated(HandOff::Queued q, Result<Placement> r) {
  if (halted_ || !hand_off_) return;
  HandOff& h = *hand_off_;
  --h.relocating;
  const std::pair<std::string, std::string> key{q.group, q.unit};
  const std::string where = "unit '" + q.unit + "' of '" + q.group + "'";
  if (r.ok() && r->outcome == PlacementOutcome::relocated) {
    auto& units = served_.at(q.group).units;
    if (q.running && units.count(q.unit) != 0) {
      // The new owner waits for this node's release, which on_stopped()
      // sends once the unit has stopped here.
      h.stopping.insert(key);
      begin_stop(q.group, q.unit, /*release_after=*/true);
    } else {
      if (!q.running) do_release(q.group, q.unit, q.epoch, [](Result<bool>) {});
      h.queued.erase(key);
      ++h.report.moved;
    }
  } else if (!r.ok() && r.error().message().starts_with("NOT_INSTALLED")) {
    h.queued.erase(key);
    --h.report.units;
  } else if (!r.ok() && r.error().code() == ErrorCode::coordination_failed && q.tries < kHandOffTries) {
    // Redis did not answer: tried again after a pause, the unit still
    // running here meanwhile.
    ++h.relocating;
    ++q.tries;
    auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(200 * q.tries));
    timer->async_wait([this, timer, q = std::move(q)](const asio::error_code& ec) mutable {
      if (ec || halted_ || !hand_off_) return;
      --hand_off_->relocating;
      hand_off_->queue.push_front(std::move(q));
      pump_hand_off();
      maybe_finish_hand_off();
    });
  } else {
    // It stays here until stop(); the leave script keeps it too, and a
    // later member takes it over.
    ++h.report.kept;
    log(CoordinatorLogLevel::warning,
        where + " stays on this node: " + (r.ok() ? std::string("its owner did not change") : r.error().message()));
  }
  pump_hand_off();
  maybe_finish_hand_off();
}

void Coordinator::Impl::note_handed_off(const std::string& group, const std::string& unit) {
  if (!hand_off_ || hand_off_->stopping.erase({group, unit}) == 0) return;
  HandOff& h = *hand_off_;
  h.queued.erase({group, unit});
  ++h.report.moved;
  std::size_t quarters = h.report.units == 0 ? 4 : h.report.moved * 4 / h.report.units;
  if (quarters > h.quarters_told && h.report.moved < h.report.units) {
    h.quarters_told = quarters;
    log(CoordinatorLogLevel::info, "handed off " + std::to_string(h.report.moved) + " of " +
                                       std::to_string(h.report.units) + " units");
    if (h.progress) {
      HandOffReport now = h.report;
      now.took = steady_now() - h.began;
      try {
        h.progress(now);
      } catch (...) {
      }
    }
  }
  pump_hand_off();
  maybe_finish_hand_off();
}

void Coordinator::Impl::maybe_finish_hand_off() {
  if (!hand_off_ || !hand_off_->marked || hand_off_->done) return;
  HandOff& h = *hand_off_;
  if (!h.queue.empty() || h.relocating != 0 || !h.stopping.empty()) return;
  h.done = true;
  h.report.took = steady_now() - h.began;
  log(CoordinatorLogLevel::info, "handed off " + std::to_string(h.report.moved) + " of " +
                                     std::to_string(h.report.units) + " units in " + ms_text(h.report.took) +
                                     (h.report.kept ? ", " + std::to_string(h.report.kept) + " kept" : ""));
  for (auto& w : h.waiters) w.set_value(h.report);
  h.waiters.clear();
}

// Ends a hand-off that cannot go on (or is overtaken by stop()): its
// waiters get `e`, or the report so far when there is none.
void Coordinator::Impl::end_hand_off(const std::optional<Error>& e) {
  if (!hand_off_) return;
  auto waiters = std::move(hand_off_->waiters);
  HandOffReport report = hand_off_->report;
  report.took = steady_now() - hand_off_->began;
  bool done = hand_off_->done;
  hand_off_.reset();
  if (done) return;
  for (auto& w : waiters) {
    if (e) {
      w.set_error(*e);
    } else {
      w.set_value(report);
    }
  }
}

}  // namespace troupe::cluster
