// rebalance: one Lua script that spreads a group's units evenly over the
// eligible members (live, not draining, holding a role of the group), answered with the moves it made, or with the app versions
// it waits on while more than one is live.

#include "coordinator_impl.hpp"

namespace troupe::cluster {

std::string_view to_string(RebalanceOutcome o) noexcept {
  switch (o) {
    case RebalanceOutcome::rebalanced:
      return "rebalanced";
    case RebalanceOutcome::versions_mixed:
      return "versions_mixed";
  }
  return "unknown";
}

std::string RebalanceReport::waiting_reason() const {
  if (outcome != RebalanceOutcome::versions_mixed) return {};
  std::string out = "the live members run app versions ";
  for (std::size_t i = 0; i < live_versions.size(); ++i) {
    if (i > 0) out += i + 1 == live_versions.size() ? " and " : ", ";
    out += live_versions[i].empty() ? "(none)" : live_versions[i];
  }
  return out;
}

// --- rebalance ----------------------------------------------------------------------

void Coordinator::Impl::note_rebalance(const RebalanceReport& report) {
  if (report.live_versions == rebalance_waits_on_) return;
  if (report.outcome == RebalanceOutcome::versions_mixed)
    log(CoordinatorLogLevel::info,
        "rebalancing waits until one app version remains: " + report.waiting_reason());
  else
    log(CoordinatorLogLevel::info, "rebalancing resumes: the live members run one app version");
  rebalance_waits_on_ = report.live_versions;
}

void Coordinator::Impl::do_rebalance(const std::string& group, std::size_t max_moves,
                                     Fn<void(Result<RebalanceReport>)> k) {
  if (auto v = validate_group(group); !v.ok()) return k(v.error());
  eval(Script::rebalance, {group, "1", std::to_string(max_moves)}, [this, group, k = std::move(k)](Reply r) mutable {
    if (!r.ok()) return k(std::move(r).error());
    const RedisReply& rep = *r;
    const std::string& status = rep.elements[0].str;
    if (status == "NO_ACCEPTABLE_WORKER")
      return k(Error(ErrorCode::unreachable, "NO_ACCEPTABLE_WORKER: no live member to rebalance group '" + group +
                                                 "' over" + detail::eligibility_note(rep, 1, 2)));
    if (status == "NO_CONFIG")
      return k(Error(ErrorCode::coordination_failed, "NO_CONFIG: cluster settings missing in Redis"));
    RebalanceReport report;
    if (status == "VERSIONS_MIXED") {
      if (rep.elements.size() != 2 || !rep.elements[1].is_array() || rep.elements[1].elements.size() < 2)
        return k(unexpected(Script::rebalance, rep));
      report.outcome = RebalanceOutcome::versions_mixed;
      for (const auto& v : rep.elements[1].elements) {
        std::string text;
        if (!text_of(v, text)) return k(unexpected(Script::rebalance, rep));
        report.live_versions.push_back(std::move(text));
      }
      note_rebalance(report);
      return k(std::move(report));
    }
    long long left = 0;
    if (status != "OK" || rep.elements.size() != 3 || !rep.elements[1].is_array() || !int_of(rep.elements[2], left) ||
        left < 0)
      return k(unexpected(Script::rebalance, rep));
    report.moves_left = static_cast<std::size_t>(left);
    for (const auto& m : rep.elements[1].elements) {
      long long e = 0;
      Move mv;
      mv.group = group;
      if (!m.is_array() || m.elements.size() != 4 || !text_of(m.elements[0], mv.unit) ||
          !text_of(m.elements[1], mv.from) || !text_of(m.elements[2], mv.to) || !int_of(m.elements[3], e))
        return k(unexpected(Script::rebalance, rep));
      mv.epoch = static_cast<std::uint64_t>(e);
      note_epoch(mv.epoch);
      report.moves.push_back(std::move(mv));
    }
    note_rebalance(report);
    log(CoordinatorLogLevel::info,
        "rebalanced '" + group + "': " + std::to_string(report.moves.size()) + " moves" +
            (report.moves_left ? ", " + std::to_string(report.moves_left) + " left for the next call" : ""));
    k(std::move(report));
  });
}

Future<RebalanceReport> Coordinator::Impl::rebalance(const std::string& group, std::size_t max_moves) {
  return call<RebalanceReport>([this, group, max_moves](Promise<RebalanceReport>& p) {
    do_rebalance(group, max_moves, [p = std::move(p)](Result<RebalanceReport> r) mutable {
      if (!r.ok()) return p.set_error(std::move(r).error());
      p.set_value(std::move(*r));
    });
  });
}

Future<std::vector<Move>> Coordinator::Impl::rebalance_all(const std::string& group, std::size_t max_moves) {
  return call<std::vector<Move>>([this, group, max_moves](Promise<std::vector<Move>>& p) {
    do_rebalance(group, max_moves, [p = std::move(p)](Result<RebalanceReport> r) mutable {
      if (!r.ok()) return p.set_error(std::move(r).error());
      p.set_value(std::move(r->moves));
    });
  });
}

Future<RebalanceReport> Coordinator::rebalance(const std::string& group, std::size_t max_moves) {
  return impl_->rebalance(group, max_moves);
}

}  // namespace troupe::cluster
