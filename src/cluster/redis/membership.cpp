// The coordinator's view of the cluster: the live members each heartbeat
// reports (with on_members_changed), the takeover of the units of members
// that expired, and the roles this node declares for groups.

#include "coordinator_impl.hpp"

#include "troupe/cluster/node_id.hpp"

namespace troupe::cluster {

// --- members ----------------------------------------------------------------------

void Coordinator::Impl::update_view(const RedisReply& view, const RedisReply& roles) {
  detail::MemberView parsed = detail::parse_members(view, s_.liveness_threshold);
  detail::attach_roles(parsed, view, roles);
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

// --- roles ---------------------------------------------------------------------------

namespace {
std::string describe_roles(const std::string& stored) {
  return stored == "*" ? std::string("any member") : "roles " + stored;
}
}  // namespace

Error Coordinator::Impl::roles_clash(const std::string& group, const std::string& stored,
                                     const std::string& mine) const {
  return Error(ErrorCode::invalid_argument,
               "group '" + group + "': the live members declare that " + describe_roles(stored) +
                   " may host it; node '" + s_.node_id + "' declares " + describe_roles(mine) +
                   " (every member must declare the same; to change them, restart every member that declares "
                   "the group)");
}

void Coordinator::Impl::add_role_args(std::vector<std::string>& args, bool registering) const {
  args.push_back(member_roles_);
  if (!registering) return;
  for (const auto& [group, roles] : group_roles_) {
    args.push_back(group);
    args.push_back(roles);
  }
}

Future<void> Coordinator::Impl::declare_roles(const std::string& group, std::vector<std::string> roles) {
  return call<void>([this, group, roles = std::move(roles)](Promise<void>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    for (const auto& role : roles)
      if (auto v = validate_role(role); !v.ok()) return p.set_error(v.error());
    if (phase_ == Phase::stopping || phase_ == Phase::stopped) return p.set_error(shutting_down_error());
    std::optional<std::string> previous;
    if (auto it = group_roles_.find(group); it != group_roles_.end()) previous = it->second;
    group_roles_[group] = detail::roles_text(roles, "*");
    if (phase_ == Phase::idle) return p.set_value();  // start() declares it
    if (phase_ == Phase::starting) {
      pending_declares_.emplace_back(group, std::move(p));
      return;
    }
    run_declare(group, std::move(previous), std::move(p));
  });
}

void Coordinator::Impl::run_declare(const std::string& group, std::optional<std::string> previous,
                                    Promise<void> p) {
  const std::string mine = group_roles_[group];
  auto undo = [this, group, previous] {
    if (previous)
      group_roles_[group] = *previous;
    else
      group_roles_.erase(group);
  };
  eval(Script::declare, {s_.node_id, session_, group, mine},
       [this, group, mine, undo, p = std::move(p)](Reply r) mutable {
         if (halted_) return p.set_error(shutting_down_error());
         if (!r.ok()) {
           undo();
           return p.set_error(std::move(r).error());
         }
         const RedisReply& rep = *r;
         const std::string& status = rep.elements[0].str;
         // Not registered now (fenced, or its entry was taken over): the
         // next registration declares it, under the same rule.
         if (status == "OK" || status == "NOT_MEMBER") return p.set_value();
         std::string stored;
         if (status == "ROLES_MISMATCH" && rep.elements.size() == 4 && text_of(rep.elements[2], stored)) {
           undo();
           return p.set_error(roles_clash(group, stored, mine));
         }
         undo();
         if (status == "NO_CONFIG")
           return p.set_error(Error(ErrorCode::coordination_failed, "NO_CONFIG: cluster settings missing in Redis"));
         p.set_error(unexpected(Script::declare, rep));
       });
}

}  // namespace troupe::cluster
