// The non-template half of the cluster singleton (singleton.hpp): settings
// checks, the agents' wire codecs, and serving the singleton's placement
// group on the coordinator.

#include "troupe/cluster/singleton.hpp"

#include <algorithm>

#include "troupe/cluster/node_id.hpp"
#include "troupe/core/log.hpp"

namespace troupe::cluster {

Result<void> validate(const SingletonSettings& s) {
  auto bad = [&](const std::string& what) {
    return Error(ErrorCode::invalid_argument, "singleton '" + s.name + "': " + what);
  };
  // A singleton's name follows the rule of a role: 1 to 64 of [A-Za-z0-9._-].
  if (auto v = validate_role(s.name); !v.ok()) return bad("name: " + v.error().message());
  for (const auto& r : s.roles)
    if (auto v = validate_role(r); !v.ok()) return bad("roles: " + v.error().message());
  if (s.buffer == 0) return bad("buffer must be at least 1");
  if (s.resolve_interval <= Duration::zero()) return bad("resolve_interval must be positive");
  return {};
}

namespace detail::singleton {

void encode(const Query& q, ByteWriter& w) { w.str(q.from); }
void encode(const Here& h, ByteWriter& w) {
  w.str(h.node);
  w.u64(h.epoch);
}
void encode(const Leaving& l, ByteWriter& w) {
  w.str(l.node);
  w.u64(l.epoch);
}
Result<Query> decode_query(ByteReader& r) {
  Query q;
  q.from = r.str();
  return r.finish(std::move(q));
}
Result<Here> decode_here(ByteReader& r) {
  Here h;
  h.node = r.str();
  h.epoch = r.u64();
  return r.finish(std::move(h));
}
Result<Leaving> decode_leaving(ByteReader& r) {
  Leaving l;
  l.node = r.str();
  l.epoch = r.u64();
  return r.finish(std::move(l));
}

std::string ctl_name(const std::string& name) { return "singleton-ctl/" + name; }
std::string instance_name(const std::string& name) { return "singleton/" + name; }

std::vector<std::string> other_members(Cluster& cluster) {
  std::vector<std::string> out;
  for (const auto& m : cluster.coordinator().members())
    if (m.id != cluster.node_id()) out.push_back(m.id);
  return out;
}

bool is_member(Cluster& cluster, const std::string& node) {
  auto members = cluster.coordinator().members();
  return std::any_of(members.begin(), members.end(), [&](const Member& m) { return m.id == node; });
}

Result<void> serve(Cluster& cluster, const Shared& shared, Reconciler r) {
  const std::string group = singleton_group(shared.settings.name);
  auto& c = cluster.coordinator();
  if (auto d = c.declare_roles(group, shared.settings.roles).get(); !d.ok()) return std::move(d).error();
  if (auto s = c.serve(group, std::move(r)); !s.ok()) return s;
  // Every node that may host it keeps the one unit in the desired set: it is
  // placed again after a round that found no eligible member.
  (void)c.sync(group, [unit = shared.settings.name]() -> Result<DesiredSet> { return DesiredSet{{unit, ""}}; });
  return {};
}

void log_line(bool warning, const std::string& text) {
  if (warning)
    log::warn(log::Component::cluster, text);
  else
    log::info(log::Component::cluster, text);
}

}  // namespace detail::singleton
}  // namespace troupe::cluster
