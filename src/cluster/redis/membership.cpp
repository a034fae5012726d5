// The coordinator's view of the cluster: the live members each heartbeat
// reports (with on_members_changed), and the takeover of the units of
// members that expired.

#include "coordinator_impl.hpp"

namespace troupe::cluster {

// --- members ----------------------------------------------------------------------

void Coordinator::Impl::update_view(const RedisReply& view) {
  detail::MemberView parsed = detail::parse_members(view, s_.liveness_threshold);
  for (const auto& skip : parsed.skipped) {
    std::string key = skip.id + "\n" + skip.info;
    if (warned_entries_.size() > 1000) warned_entries_.clear();
    if (warned_entries_.insert(key).second)
      log(CoordinatorLogLevel::warning, "skipping member entry '" + skip.id.substr(0, 80) + "': " + skip.why);
  }
  std::vector<Member>& live = parsed.live;
  bool changed = live.size() != last_members_.size();
  for (std::size_t i = 0; !changed && i < live.size(); ++i)
    changed = live[i].id != last_members_[i].id || !(live[i].address == last_members_[i].address);
  {
    std::lock_guard lk(view_mu_);
    members_view_ = live;
  }
  if (changed) {
    last_members_ = live;
    if (s_.on_members_changed) {
      try {
        s_.on_members_changed(live);
      } catch (...) {
        log(CoordinatorLogLevel::error, "on_members_changed threw");
      }
    }
  }
}

void Coordinator::Impl::run_takeover(std::vector<std::string> dead) {
  if (takeover_in_flight_ || fenced_ || phase_ != Phase::running) return;
  takeover_in_flight_ = true;
  std::vector<std::string> args{s_.node_id, session_,
                                std::to_string(std::max<std::size_t>(1, s_.takeover_batch))};
  args.insert(args.end(), dead.begin(), dead.end());
  eval(Script::takeover, std::move(args), [this, dead](Reply r) {
    takeover_in_flight_ = false;
    if (halted_) return;
    if (!r.ok()) {
      log(CoordinatorLogLevel::warning, "takeover failed: " + r.error().message());
      return;
    }
    const RedisReply& rep = *r;
    if (rep.elements[0].str != "OK") return;  // NOT_ELIGIBLE, NO_CONFIG: a later heartbeat tries again
    long long more = 0;
    if (rep.elements.size() != 3 || !int_of(rep.elements[1], more) || !rep.elements[2].is_array()) {
      (void)unexpected(Script::takeover, rep);
      return;
    }
    std::map<std::string, std::size_t> per_member;
    for (const auto& m : rep.elements[2].elements) {
      long long e = 0;
      if (m.is_array() && m.elements.size() == 5 && int_of(m.elements[4], e)) {
        note_epoch(static_cast<std::uint64_t>(e));
        ++per_member[m.elements[2].str];
      }
    }
    for (const auto& [member, n] : per_member)
      log(CoordinatorLogLevel::info,
          "took over " + std::to_string(n) + " units of expired member '" + member + "'");
    if (more != 0) asio::post(io_, [this, dead] { run_takeover(dead); });
  });
}

}  // namespace troupe::cluster
