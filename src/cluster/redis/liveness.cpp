// The coordinator's heartbeat: a script every heartbeat_interval that
// registers this node or stamps it live, answered with the live members and
// the expired ones to take over; and what each answer (GONE, IN_USE,
// SUPERSEDED, CONFIG_MISMATCH, ROLES_MISMATCH) means for this node.

#include "coordinator_impl.hpp"

namespace troupe::cluster {

// --- heartbeat -----------------------------------------------------------------------

void Coordinator::Impl::tick() {
  if (halted_ || (phase_ != Phase::running && phase_ != Phase::stopping)) return;
  send_beat();
  heartbeat_timer_.expires_after(s_.heartbeat_interval);
  heartbeat_timer_.async_wait([this](const asio::error_code& ec) {
    if (!ec) tick();
  });
}

void Coordinator::Impl::send_beat() {
  // Its own connection: commands queued behind placement traffic on the
  // others never hold a heartbeat back, nor does their timeout close it.
  if (halted_ || beat_in_flight_ || !beat_.ready() || superseded_) return;
  if (phase_ != Phase::running && phase_ != Phase::stopping && phase_ != Phase::starting) return;
  beat_in_flight_ = true;
  bool registering = fenced_ || !registered_ || phase_ == Phase::starting;
  if (registering && s_.epoch_floor) note_epoch(s_.epoch_floor());
  TimePoint sent = steady_now();
  std::vector<std::string> args{s_.node_id, session_, s_.address.host, std::to_string(s_.address.port),
                                registering ? "register" : "beat", std::to_string(to_ms(s_.liveness_threshold)),
                                std::to_string(to_ms(s_.takeover_margin)), std::to_string(max_epoch_seen_),
                                std::to_string(std::max<std::size_t>(1, s_.takeover_batch)), s_.app_version};
  add_role_args(args, registering);
  eval_on(beat_, Script::heartbeat, std::move(args),
       [this, sent, registering](Reply r) {
         beat_in_flight_ = false;
         if (halted_) return;
         on_beat(sent, registering, std::move(r));
       });
}

void Coordinator::Impl::on_beat(TimePoint sent, bool registering, Reply r) {
  if (!r.ok()) {
    if (phase_ == Phase::starting) {
      fail_start(Error(ErrorCode::coordination_failed, "cannot register: " + r.error().message()));
      return;
    }
    log(CoordinatorLogLevel::debug, "heartbeat failed: " + r.error().message());
    return;
  }
  const RedisReply& rep = *r;
  const std::string& status = rep.elements[0].str;
  if (status == "OK" && rep.elements.size() == 7 && rep.elements[4].is_array() &&
      rep.elements[5].is_array() && rep.elements[6].is_array()) {
    long long since = 0, others = 0;
    if (!int_of(rep.elements[2], since) || !int_of(rep.elements[3], others)) {
      (void)unexpected(Script::heartbeat, rep);
      return;
    }
    last_ok_send_ = std::max(last_ok_send_, sent);
    registered_ = true;
    // A reply that arrives after the lease ran out (a slow Redis) proves
    // nothing about now: only a registration sent while fenced, within its
    // own lease, lifts the fence.
    bool lease_valid = steady_now() < last_ok_send_ + s_.liveness_threshold;
    arm_fence_timer();
    update_view(rep.elements[4], rep.elements[6]);
    std::vector<std::string> dead;
    for (const auto& d : rep.elements[5].elements) {
      std::string id;
      if (text_of(d, id)) dead.push_back(std::move(id));
    }
    if (phase_ == Phase::starting) {
      {
        std::lock_guard lk(view_mu_);
        first_manager_ = (others == 0);
      }
      finish_start();
    } else if (fenced_ && registering && lease_valid) {
      unfence();
    }
    if (!dead.empty()) run_takeover(std::move(dead));
    for (auto& [group, g] : served_)
      if (!g.awaited.empty()) reconcile(group);
    return;
  }
  if (status == "GONE") {
    // Our entry was removed, so our units were taken over: stop them now,
    // then register again.
    registered_ = false;
    if (!fenced_) fence("this node's membership was removed from Redis (its units were taken over)");
    asio::post(io_, [this] { send_beat(); });
    return;
  }
  if (status == "IN_USE") {
    long long age = 0;
    if (rep.elements.size() > 2) (void)int_of(rep.elements[2], age);
    if (phase_ == Phase::starting && steady_now() < start_deadline_) {
      log(CoordinatorLogLevel::info, "node id '" + s_.node_id +
                                         "' is still registered by another process (last heartbeat " +
                                         std::to_string(age) + " ms ago); waiting for that entry to expire");
      start_retry_timer_.expires_after(s_.heartbeat_interval);
      start_retry_timer_.async_wait([this](const asio::error_code& ec) {
        if (!ec && phase_ == Phase::starting) send_beat();
      });
      return;
    }
    Error e(ErrorCode::invalid_argument, "node id '" + s_.node_id +
                                             "' is in use by another live process (last heartbeat " +
                                             std::to_string(age) + " ms ago)");
    if (phase_ == Phase::starting) {
      fail_start(e);
      return;
    }
    superseded_ = true;
    fence(e.message());
    return;
  }
  if (status == "SUPERSEDED") {
    superseded_ = true;
    log(CoordinatorLogLevel::error, "another process registered node id '" + s_.node_id +
                                        "' after this one expired; this coordinator stays fenced");
    if (!fenced_) fence("superseded by another process with the same node id");
    return;
  }
  if (status == "CONFIG_MISMATCH") {
    long long t = 0, m = 0;
    if (rep.elements.size() > 3) {
      (void)int_of(rep.elements[2], t);
      (void)int_of(rep.elements[3], m);
    }
    Error e(ErrorCode::invalid_argument,
            "the cluster uses liveness_threshold " + std::to_string(t) + " ms and takeover_margin " +
                std::to_string(m) + " ms; this node has " + ms_text(s_.liveness_threshold) + " and " +
                ms_text(s_.takeover_margin) + " (every member must use one rule)");
    if (phase_ == Phase::starting) {
      fail_start(e);
      return;
    }
    log(CoordinatorLogLevel::error, e.message());
    return;
  }
  if (status == "ROLES_MISMATCH" && rep.elements.size() == 5) {
    std::string group, stored, mine;
    if (!text_of(rep.elements[2], group) || !text_of(rep.elements[3], stored) || !text_of(rep.elements[4], mine)) {
      (void)unexpected(Script::heartbeat, rep);
      return;
    }
    Error e = roles_clash(group, stored, mine);
    if (phase_ == Phase::starting) {
      fail_start(e);
      return;
    }
    // Registering again (after a fence) while the live members declare
    // other roles: it stays out (fenced) and says so once.
    if (e.message() != roles_clash_logged_) log(CoordinatorLogLevel::error, e.message());
    roles_clash_logged_ = e.message();
    return;
  }
  (void)unexpected(Script::heartbeat, rep);
}

}  // namespace troupe::cluster
