// Placement of single units: assign, relocate, unassign, release, and the
// reads (assignment, owned_units), each one Lua script run by the
// coordinator's io thread. sync.cpp applies a desired set through the same
// do_assign, do_set_spec and do_unassign.

#include "coordinator_impl.hpp"

namespace troupe::cluster {

std::string_view to_string(PlacementOutcome o) noexcept {
  switch (o) {
    case PlacementOutcome::assigned:
      return "ASSIGNED";
    case PlacementOutcome::already_installed:
      return "ALREADY_INSTALLED";
    case PlacementOutcome::relocated:
      return "RELOCATED";
    case PlacementOutcome::no_need_to_relocate:
      return "NO_NEED_TO_RELOCATE";
  }
  return "?";
}

// --- placement ----------------------------------------------------------------------

// As seed 001 logs the outcomes of assign and relocate: the informational
// ones (ASSIGNED, ALREADY_INSTALLED, RELOCATED, NO_NEED_TO_RELOCATE) at
// info; NO_ACCEPTABLE_WORKER, NO_OTHER_ACCEPTABLE_WORKER and NOT_INSTALLED,
// which leave a unit without the owner asked for, at error; Redis' own
// failures at warning (the caller gets them as values and may retry).
void Coordinator::Impl::log_placement(const std::string& group, const std::string& unit,
                                      const Result<Placement>& r) const {
  if (r.ok()) {
    log(CoordinatorLogLevel::info, std::string(to_string(r->outcome)) + ": unit '" + unit + "' of group '" + group +
                                       "' on " + r->assignment.owner + " epoch " +
                                       std::to_string(r->assignment.epoch));
    return;
  }
  const std::string& m = r.error().message();
  const bool placement = m.starts_with("NO_ACCEPTABLE_WORKER") || m.starts_with("NO_OTHER_ACCEPTABLE_WORKER") ||
                         m.starts_with("NOT_INSTALLED");
  log(placement ? CoordinatorLogLevel::error : CoordinatorLogLevel::warning, m);
}

void Coordinator::Impl::do_assign(const std::string& group, const std::string& unit, const std::string& spec,
                                  bool notify, Fn<void(Result<Placement>)> k) {
  eval(Script::assign, {group, unit, spec, notify ? "1" : "0"},
       [this, group, unit, k = std::move(k)](Reply r) mutable {
         if (!r.ok()) return k(std::move(r).error());
         const RedisReply& rep = *r;
         const std::string& status = rep.elements[0].str;
         if ((status == "ASSIGNED" || status == "ALREADY_INSTALLED") && rep.elements.size() == 2) {
           auto a = parse_assignment(rep.elements[1], group, unit);
           if (!a) return k(unexpected(Script::assign, rep));
           note_epoch(a->epoch);
           return k(Placement{
               status == "ASSIGNED" ? PlacementOutcome::assigned : PlacementOutcome::already_installed,
               std::move(*a)});
         }
         if (status == "NO_ACCEPTABLE_WORKER")
           return k(Error(ErrorCode::unreachable, "NO_ACCEPTABLE_WORKER: no live member can take unit '" +
                                                      unit + "' of group '" + group + "'" +
                                                      detail::eligibility_note(rep, 1, 2)));
         if (status == "NO_CONFIG")
           return k(Error(
               ErrorCode::coordination_failed,
               "NO_CONFIG: the cluster's settings are missing in Redis (was it flushed?); members restore "
               "them when they register"));
         k(unexpected(Script::assign, rep));
       });
}

void Coordinator::Impl::do_unassign(const std::string& group, const std::string& unit, bool notify,
                                    Fn<void(Result<bool>)> k) {
  eval(Script::unassign, {group, unit, notify ? "1" : "0"}, [this, k = std::move(k)](Reply r) mutable {
    if (!r.ok()) return k(std::move(r).error());
    const std::string& status = r->elements[0].str;
    if (status == "UNASSIGNED") return k(true);
    if (status == "NOT_INSTALLED") return k(false);
    if (status == "NO_CONFIG")
      return k(Error(ErrorCode::coordination_failed, "NO_CONFIG: cluster settings missing"));
    k(unexpected(Script::unassign, *r));
  });
}

void Coordinator::Impl::do_set_spec(const std::string& group, const std::string& unit,
                                    const std::string& spec, bool notify, Fn<void(Result<bool>)> k) {
  eval(Script::set_spec, {group, unit, spec, notify ? "1" : "0"},
       [this, group, unit, k = std::move(k)](Reply r) mutable {
         if (!r.ok()) return k(std::move(r).error());
         const std::string& status = r->elements[0].str;
         if (status == "UPDATED") return k(true);
         if (status == "UNCHANGED") return k(false);
         if (status == "NOT_INSTALLED")
           return k(Error(ErrorCode::invalid_argument,
                          "NOT_INSTALLED: unit '" + unit + "' of group '" + group + "' is not placed"));
         if (status == "NO_CONFIG")
           return k(Error(ErrorCode::coordination_failed, "NO_CONFIG: cluster settings missing"));
         k(unexpected(Script::set_spec, *r));
       });
}

void Coordinator::Impl::do_release(const std::string& group, const std::string& unit, std::uint64_t epoch,
                                   Fn<void(Result<bool>)> k) {
  // Releases wait for the end of this turn of the event loop and go out
  // together: units stopped meanwhile share one script call and one
  // notice.
  release_batch_[group].push_back(QueuedRelease{unit, epoch, std::move(k)});
  if (release_flush_posted_) return;
  release_flush_posted_ = true;
  asio::post(io_, [this] {
    release_flush_posted_ = false;
    if (!halted_) flush_releases();
  });
}

void Coordinator::Impl::flush_releases() {
  constexpr std::size_t per_call = 256;
  auto batches = std::move(release_batch_);
  release_batch_.clear();
  for (auto& [group, queued] : batches) {
    for (std::size_t at = 0; at < queued.size(); at += per_call) {
      std::vector<QueuedRelease> chunk;
      std::vector<std::string> args{group, s_.node_id, session_};
      for (std::size_t i = at; i < std::min(queued.size(), at + per_call); ++i) {
        args.push_back(queued[i].unit);
        args.push_back(std::to_string(queued[i].epoch));
        chunk.push_back(std::move(queued[i]));
      }
      eval(Script::release, std::move(args), [this, group, chunk = std::move(chunk)](Reply r) mutable {
        if (r.ok() && (r->elements[0].str != "OK" || r->elements.size() != 2 || !r->elements[1].is_array() ||
                       r->elements[1].elements.size() != chunk.size()))
          r = unexpected(Script::release, *r);
        if (!r.ok())
          log(CoordinatorLogLevel::warning, "release of " + std::to_string(chunk.size()) + " unit(s) in '" +
                                                group + "' failed: " + r.error().message());
        for (std::size_t i = 0; i < chunk.size(); ++i) {
          if (!chunk[i].k) continue;
          if (!r.ok()) {
            chunk[i].k(r.error());
          } else {
            chunk[i].k(r->elements[1].elements[i].integer == 1);
          }
        }
      });
    }
  }
}

Future<Placement> Coordinator::Impl::assign(const std::string& group, const std::string& unit,
                                            const std::string& spec) {
  return call<Placement>([this, group, unit, spec](Promise<Placement>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    if (auto v = validate_unit(unit); !v.ok()) return p.set_error(v.error());
    do_assign(group, unit, spec, true, [this, group, unit, p = std::move(p)](Result<Placement> r) mutable {
      log_placement(group, unit, r);
      p.set_result(std::move(r));
    });
  });
}

void Coordinator::Impl::do_relocate(const std::string& group, const std::string& unit, bool force,
                                    Fn<void(Result<Placement>)> k) {
  eval(Script::relocate, {group, unit, force ? "1" : "0", "1"},
       [this, group, unit, k = std::move(k)](Reply r) mutable {
         if (!r.ok()) return k(std::move(r).error());
         const RedisReply& rep = *r;
         const std::string& status = rep.elements[0].str;
         auto where = "unit '" + unit + "' of group '" + group + "'";
         if ((status == "RELOCATED" || status == "NO_NEED_TO_RELOCATE") && rep.elements.size() == 2) {
           auto a = parse_assignment(rep.elements[1], group, unit);
           if (!a) return k(unexpected(Script::relocate, rep));
           note_epoch(a->epoch);
           return k(Placement{
               status == "RELOCATED" ? PlacementOutcome::relocated : PlacementOutcome::no_need_to_relocate,
               std::move(*a)});
         }
         if (status == "NOT_INSTALLED")
           return k(Error(ErrorCode::invalid_argument, "NOT_INSTALLED: " + where + " is not placed"));
         if (status == "NO_OTHER_ACCEPTABLE_WORKER")
           return k(Error(ErrorCode::unreachable, "NO_OTHER_ACCEPTABLE_WORKER: no live member but its owner can take " +
                                                      where + detail::eligibility_note(rep, 2, 3)));
         if (status == "NO_ACCEPTABLE_WORKER")
           return k(Error(ErrorCode::unreachable,
                          "NO_ACCEPTABLE_WORKER: no live member can take " + where + detail::eligibility_note(rep, 1, 2)));
         if (status == "NO_CONFIG")
           return k(Error(ErrorCode::coordination_failed, "NO_CONFIG: cluster settings missing in Redis"));
         k(unexpected(Script::relocate, rep));
       });
}

Future<Placement> Coordinator::Impl::relocate(const std::string& group, const std::string& unit, bool force) {
  return call<Placement>([this, group, unit, force](Promise<Placement>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    if (auto v = validate_unit(unit); !v.ok()) return p.set_error(v.error());
    do_relocate(group, unit, force, [this, group, unit, p = std::move(p)](Result<Placement> r) mutable {
      log_placement(group, unit, r);
      p.set_result(std::move(r));
    });
  });
}

Future<bool> Coordinator::Impl::unassign(const std::string& group, const std::string& unit) {
  return call<bool>([this, group, unit](Promise<bool>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    if (auto v = validate_unit(unit); !v.ok()) return p.set_error(v.error());
    do_unassign(group, unit, true,
                [p = std::move(p)](Result<bool> r) mutable { p.set_result(std::move(r)); });
  });
}

Future<std::optional<Assignment>> Coordinator::Impl::assignment(const std::string& group,
                                                                const std::string& unit) {
  return call<std::optional<Assignment>>([this, group, unit](Promise<std::optional<Assignment>>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    if (auto v = validate_unit(unit); !v.ok()) return p.set_error(v.error());
    eval(Script::lookup, {group, unit}, [this, group, unit, p = std::move(p)](Reply r) mutable {
      if (!r.ok()) return p.set_error(std::move(r).error());
      const RedisReply& rep = *r;
      const std::string& status = rep.elements[0].str;
      if (status == "NOT_INSTALLED") return p.set_value(std::nullopt);
      if (status == "NO_CONFIG")
        return p.set_error(
            Error(ErrorCode::coordination_failed, "NO_CONFIG: cluster settings missing in Redis"));
      std::optional<Assignment> a;
      if (status == "OK" && rep.elements.size() == 2) a = parse_assignment(rep.elements[1], group, unit);
      if (!a) return p.set_error(unexpected(Script::lookup, rep));
      p.set_value(std::move(a));
    });
  });
}

Future<std::vector<Assignment>> Coordinator::Impl::owned_units(const std::string& group) {
  return call<std::vector<Assignment>>([this, group](Promise<std::vector<Assignment>>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    eval(Script::my_units, {group, s_.node_id}, [this, group, p = std::move(p)](Reply r) mutable {
      if (!r.ok()) return p.set_error(std::move(r).error());
      const RedisReply& rep = *r;
      if (rep.elements[0].str != "OK" || rep.elements.size() != 3 || !rep.elements[2].is_array())
        return p.set_error(unexpected(Script::my_units, rep));
      std::vector<Assignment> out;
      for (const auto& u : rep.elements[2].elements) {
        Assignment a;
        long long e = 0, we = 0;
        if (!u.is_array() || u.elements.size() != 5 || !text_of(u.elements[0], a.unit) ||
            !int_of(u.elements[1], e) || !text_of(u.elements[2], a.spec) ||
            !text_of(u.elements[3], a.handing_off_from) || !int_of(u.elements[4], we))
          return p.set_error(unexpected(Script::my_units, rep));
        a.group = group;
        a.owner = s_.node_id;
        a.epoch = static_cast<std::uint64_t>(e);
        a.handoff_epoch = static_cast<std::uint64_t>(we);
        out.push_back(std::move(a));
      }
      std::sort(out.begin(), out.end(),
                [](const Assignment& x, const Assignment& y) { return x.unit < y.unit; });
      p.set_value(std::move(out));
    });
  });
}

Future<bool> Coordinator::Impl::release(const std::string& group, const std::string& unit,
                                        std::uint64_t epoch) {
  return call<bool>([this, group, unit, epoch](Promise<bool>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    if (auto v = validate_unit(unit); !v.ok()) return p.set_error(v.error());
    if (fenced_) {
      return p.set_error(
          Error(ErrorCode::fenced, "node '" + s_.node_id + "' is fenced; it releases once it is not"));
    }
    do_release(group, unit, epoch,
               [p = std::move(p)](Result<bool> r) mutable { p.set_result(std::move(r)); });
  });
}

}  // namespace troupe::cluster
