// rebalance_all: one Lua script that spreads a group's units evenly over
// the live members, answered with the moves it made.

#include "coordinator_impl.hpp"

namespace troupe::cluster {

// --- rebalance ----------------------------------------------------------------------

Future<std::vector<Move>> Coordinator::Impl::rebalance_all(const std::string& group) {
  return call<std::vector<Move>>([this, group](Promise<std::vector<Move>>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    eval(Script::rebalance, {group, "1"}, [this, group, p = std::move(p)](Reply r) mutable {
      if (!r.ok()) return p.set_error(std::move(r).error());
      const RedisReply& rep = *r;
      const std::string& status = rep.elements[0].str;
      if (status == "NO_ACCEPTABLE_WORKER")
        return p.set_error(
            Error(ErrorCode::unreachable,
                  "NO_ACCEPTABLE_WORKER: no live member to rebalance group '" + group + "' over"));
      if (status == "NO_CONFIG")
        return p.set_error(
            Error(ErrorCode::coordination_failed, "NO_CONFIG: cluster settings missing in Redis"));
      if (status != "OK" || rep.elements.size() != 2 || !rep.elements[1].is_array())
        return p.set_error(unexpected(Script::rebalance, rep));
      std::vector<Move> moves;
      for (const auto& m : rep.elements[1].elements) {
        long long e = 0;
        Move mv;
        mv.group = group;
        if (!m.is_array() || m.elements.size() != 4 || !text_of(m.elements[0], mv.unit) ||
            !text_of(m.elements[1], mv.from) || !text_of(m.elements[2], mv.to) || !int_of(m.elements[3], e))
          return p.set_error(unexpected(Script::rebalance, rep));
        mv.epoch = static_cast<std::uint64_t>(e);
        note_epoch(mv.epoch);
        moves.push_back(std::move(mv));
      }
      log(CoordinatorLogLevel::info,
          "rebalanced '" + group + "': " + std::to_string(moves.size()) + " moves");
      p.set_value(std::move(moves));
    });
  });
}

}  // namespace troupe::cluster
