#pragma once
// The Lua scripts that change placement state in Redis, and the key names
// they use. doc/redis.md describes every key and every script's inputs,
// outputs and outcomes; keep the two in step.
//
// Every key is "{<prefix>}:...": the braces make the prefix the hash tag,
// so every key of one cluster lives in one Redis Cluster hash slot and a
// script may touch any of them. Every script receives the same five fixed
// keys as KEYS (so a cluster-aware client routes it to that slot) and the
// "{<prefix>}" base as ARGV[1], from which it derives per-group and
// per-member key names.

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::cluster::detail {

enum class Script : std::size_t {
  heartbeat,  // register or renew this member; the members view; dead members to take over
  takeover,   // move expired members' units to live members, in bounded batches
  assign,     // W3
  relocate,   // W4
  unassign,
  set_spec,   // change a unit's spec in place (same owner, same epoch)
  my_units,   // this member's units in a group, with the hand-offs it must still wait for
  release,    // the previous owner has stopped a unit: clear its hand-off
  rebalance,  // W6
  lookup,     // one unit's assignment
  leave,      // graceful departure: hand every unit to other live members
  snapshot,   // a group's units and specs (for sync)
  drain,      // mark this member as handing its units off: nothing new is placed on it
  declare,    // the roles that may host a group served after start-up
};
inline constexpr std::size_t script_count = 14;

// The prelude and each script's body, concatenated: what is loaded.
const std::string& script_text(Script s);
std::string_view script_name(Script s);

// Each script's body, run after the shared prelude (scripts.cpp):
// membership in scripts_membership.cpp, placement in scripts_placement.cpp.
namespace lua {
extern const std::string_view heartbeat, takeover, leave, drain, declare;
extern const std::string_view assign, relocate, unassign, set_spec, my_units, release, rebalance, lookup,
    snapshot;
}  // namespace lua

// Key names of one cluster (one prefix). A value type: immutable after
// construction, so any thread may use one.
class KeyNames {
 public:
  explicit KeyNames(std::string_view prefix) : base_("{" + std::string(prefix) + "}") {}
  const std::string& base() const noexcept { return base_; }
  std::string members() const { return base_ + ":members"; }
  std::string member_info() const { return base_ + ":member_info"; }
  std::string config() const { return base_ + ":config"; }
  std::string epoch() const { return base_ + ":epoch"; }
  std::string groups() const { return base_ + ":groups"; }
  std::string events() const { return base_ + ":events"; }
  std::string member_roles() const { return base_ + ":member_roles"; }
  std::string group_roles() const { return base_ + ":group_roles"; }
  std::string owners() const { return base_ + ":owners"; }
  std::string absent() const { return base_ + ":absent"; }
  std::string group(std::string_view g, std::string_view what) const {
    return base_ + ":group:" + std::string(g) + ":" + std::string(what);
  }
  std::string units_of(std::string_view g, std::string_view member) const {
    return base_ + ":group:" + std::string(g) + ":units:" + std::string(member);
  }
  // KEYS of every script, in order.
  std::vector<std::string> script_keys() const {
    return {members(), member_info(), config(), epoch(), groups()};
  }

 private:
  std::string base_;
};

}  // namespace troupe::cluster::detail
