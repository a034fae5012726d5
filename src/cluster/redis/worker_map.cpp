// Bulk reads of the placement, for views of the whole cluster (the node's
// worker map): every group's name, and every unit of one group with its
// owner, epoch and hand-off, in a fixed number of round trips whatever the
// number of units. Plain Redis reads, no script: they change nothing.

#include <charconv>

#include "coordinator_impl.hpp"
#include "troupe/cluster/node_id.hpp"

namespace troupe::cluster {

namespace {

// A stored decimal number, all of `s`; false for anything else.
bool whole_number(std::string_view s, long long& out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

// The bound on a stored wall time: 10^15 ms is year 33658, and converting
// it to WallTime cannot overflow.
constexpr long long kMaxStoredMs = 1'000'000'000'000'000LL;

// `{P}:group:<G>:assign`'s value: "<epoch> <owner> <updated_ms>".
bool read_assign(std::string_view value, Assignment& a) {
  auto w = detail::split_words(value);
  long long epoch = 0, updated = 0;
  if (w.size() != 3 || !whole_number(w[0], epoch) || epoch < 0 || !validate_node_id(w[1]).ok() ||
      !whole_number(w[2], updated) || updated < 0 || updated > kMaxStoredMs)
    return false;
  a.epoch = static_cast<std::uint64_t>(epoch);
  a.owner = std::move(w[1]);
  a.updated = WallTime(std::chrono::milliseconds(updated));
  return true;
}

// `{P}:group:<G>:handoff`'s value: "<previous_owner> <its_epoch> <its_session>".
bool read_handoff(std::string_view value, Assignment& a) {
  auto w = detail::split_words(value);
  long long epoch = 0;
  if (w.size() != 3 || !validate_node_id(w[0]).ok() || !whole_number(w[1], epoch) || epoch < 0) return false;
  a.handing_off_from = std::move(w[0]);
  a.handoff_epoch = static_cast<std::uint64_t>(epoch);
  return true;
}

}  // namespace

std::optional<Error> Coordinator::Impl::read_refused() const {
  if (phase_ == Phase::stopped) return shutting_down_error();
  if (phase_ == Phase::idle)
    return Error(ErrorCode::not_ready,
                 "the coordinator of node '" + s_.node_id + "' is not started; call start() first");
  if (!link_up_) return not_connected_error();
  return std::nullopt;
}

Future<std::vector<std::string>> Coordinator::Impl::groups() {
  return call<std::vector<std::string>>([this](Promise<std::vector<std::string>>& p) {
    if (auto e = read_refused()) return p.set_error(*e);
    cmd_.command({"SMEMBERS", keys_.groups()}, [this, p = std::move(p)](Reply r) mutable {
      if (!r.ok()) return p.set_error(std::move(r).error());
      if (!r->is_array())
        return p.set_error(Error(ErrorCode::coordination_failed,
                                 "unexpected reply from Redis at " + endpoint_.describe() + " to SMEMBERS " +
                                     keys_.groups() + ": " + r->describe()));
      std::vector<std::string> out;
      for (const auto& e : r->elements) {
        std::string g;
        // A name no group may have was written by someone else: not a group.
        if (text_of(e, g) && validate_group(g).ok()) out.push_back(std::move(g));
      }
      std::sort(out.begin(), out.end());
      p.set_value(std::move(out));
    });
  });
}

Future<std::vector<Assignment>> Coordinator::Impl::placements(const std::string& group) {
  return call<std::vector<Assignment>>([this, group](Promise<std::vector<Assignment>>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    if (auto e = read_refused()) return p.set_error(*e);
    // Sent back to back from this thread, so nothing comes between them:
    // one round trip, and EXEC answers both reads from one moment.
    cmd_.command({"MULTI"}, [](Reply) {});
    cmd_.command({"HGETALL", keys_.group(group, "assign")}, [](Reply) {});
    cmd_.command({"HGETALL", keys_.group(group, "handoff")}, [](Reply) {});
    cmd_.command({"EXEC"}, [this, group, p = std::move(p)](Reply r) mutable {
      if (!r.ok()) return p.set_error(std::move(r).error());
      const RedisReply& rep = *r;
      auto bad = [&] {
        return Error(ErrorCode::coordination_failed, "unexpected reply from Redis at " + endpoint_.describe() +
                                                         " to the read of group '" + group + "': " + rep.describe());
      };
      if (!rep.is_array() || rep.elements.size() != 2 || !rep.elements[0].is_array() ||
          !rep.elements[1].is_array())
        return p.set_error(bad());
      const auto& assigns = rep.elements[0].elements;
      const auto& handoffs = rep.elements[1].elements;
      std::map<std::string, const RedisReply*> handoff_of;
      for (std::size_t i = 0; i + 1 < handoffs.size(); i += 2) handoff_of[handoffs[i].str] = &handoffs[i + 1];
      std::vector<Assignment> out;
      out.reserve(assigns.size() / 2);
      for (std::size_t i = 0; i + 1 < assigns.size(); i += 2) {
        Assignment a;
        a.group = group;
        std::string value;
        bool ok = text_of(assigns[i], a.unit) && validate_unit(a.unit).ok() && text_of(assigns[i + 1], value) &&
                  read_assign(value, a);
        if (ok) {
          auto h = handoff_of.find(a.unit);
          std::string hv;
          ok = h == handoff_of.end() || (text_of(*h->second, hv) && read_handoff(hv, a));
        }
        if (!ok) {
          // Written by someone else: skipped, and said once.
          if (warned_entries_.insert("placement " + group + " " + assigns[i].str).second)
            log(CoordinatorLogLevel::warning, "skipping unit '" + assigns[i].str + "' of group '" + group +
                                                  "': its entry in Redis does not read ('" + value + "')");
          continue;
        }
        out.push_back(std::move(a));
      }
      std::sort(out.begin(), out.end(), [](const Assignment& x, const Assignment& y) { return x.unit < y.unit; });
      p.set_value(std::move(out));
    });
  });
}

Future<std::vector<std::string>> Coordinator::groups() { return impl_->groups(); }
Future<std::vector<Assignment>> Coordinator::placements(const std::string& group) {
  return impl_->placements(group);
}

}  // namespace troupe::cluster
