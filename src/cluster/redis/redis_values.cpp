// The values the coordinator reads out of Redis replies: see
// redis_values.hpp.

#include "redis_values.hpp"  // first: it includes Asio first

#include <algorithm>
#include <chrono>
#include <map>

#include "troupe/cluster/node_id.hpp"

namespace troupe::cluster::detail {

using std::chrono::milliseconds;

namespace {
// Milliseconds a Duration (and a WallTime) can hold either way: a count
// read from Redis beyond this is corrupt, and converting it would overflow.
constexpr long long kMaxMillis = std::chrono::duration_cast<milliseconds>(Duration::max()).count();
bool representable_ms(long long ms) { return ms >= -kMaxMillis && ms <= kMaxMillis; }
}  // namespace

bool text_of(const RedisReply& r, std::string& out) {
  if (!r.is_text()) return false;
  out = r.str;
  return true;
}

bool int_of(const RedisReply& r, long long& out) {
  if (r.type == RedisReply::Type::integer) {
    out = r.integer;
    return true;
  }
  if (r.type == RedisReply::Type::string && !r.str.empty()) {
    try {
      std::size_t used = 0;
      out = std::stoll(r.str, &used);
      return used == r.str.size();
    } catch (...) {
      return false;
    }
  }
  return false;
}

std::vector<std::string> split_words(std::string_view s) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    std::size_t j = i;
    while (j < s.size() && s[j] != ' ') ++j;
    if (j > i) out.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string roles_text(std::vector<std::string> roles, std::string_view none) {
  std::sort(roles.begin(), roles.end());
  roles.erase(std::unique(roles.begin(), roles.end()), roles.end());
  if (roles.empty()) return std::string(none);
  std::string out;
  for (const auto& r : roles) {
    if (!out.empty()) out += ',';
    out += r;
  }
  return out;
}

std::vector<std::string> split_roles(std::string_view text) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i <= text.size()) {
    std::size_t j = text.find(',', i);
    if (j == std::string_view::npos) j = text.size();
    if (j > i) out.emplace_back(text.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

std::string eligibility_note(const RedisReply& rep, std::size_t roles_at, std::size_t live_at) {
  std::string roles;
  if (rep.elements.size() <= roles_at || !text_of(rep.elements[roles_at], roles) || roles.empty() || roles == "*")
    return "";
  std::string out = " (only members holding role ";
  auto list = split_roles(roles);
  for (std::size_t i = 0; i < list.size(); ++i) out += (i == 0 ? "" : i + 1 == list.size() ? " or " : ", ") + list[i];
  out += " may host it";
  long long live = 0;
  if (rep.elements.size() > live_at && int_of(rep.elements[live_at], live) && live > 0)
    out += "; " + std::to_string(live) + " live member" + (live == 1 ? "" : "s") + ", none of them eligible";
  return out + ")";
}

std::optional<Assignment> parse_assignment(const RedisReply& d, const std::string& group, const std::string& unit) {
  if (!d.is_array() || d.elements.size() != 6) return std::nullopt;
  Assignment a;
  a.group = group;
  a.unit = unit;
  long long epoch = 0, updated = 0, he = 0;
  if (!text_of(d.elements[0], a.owner) || !int_of(d.elements[1], epoch) || !int_of(d.elements[2], updated) ||
      !text_of(d.elements[3], a.spec) || !text_of(d.elements[4], a.handing_off_from) ||
      !int_of(d.elements[5], he))
    return std::nullopt;
  if (!validate_node_id(a.owner).ok() || !representable_ms(updated)) return std::nullopt;
  a.epoch = static_cast<std::uint64_t>(epoch);
  a.updated = WallTime(milliseconds(updated));
  a.handoff_epoch = static_cast<std::uint64_t>(he);
  return a;
}

MemberView parse_members(const RedisReply& view, Duration liveness_threshold) {
  MemberView out;
  const auto& el = view.elements;
  for (std::size_t i = 0; i + 2 < el.size(); i += 3) {
    std::string id, info;
    long long age = 0;
    if (!text_of(el[i], id) || !int_of(el[i + 1], age) || !text_of(el[i + 2], info)) continue;
    auto bad = [&](std::string why) { out.skipped.push_back(SkippedMember{id, info, std::move(why)}); };
    if (auto v = validate_node_id(id); !v.ok()) {
      bad(v.error().message());
      continue;
    }
    // Words after the port are a later version's (a rolling update runs
    // old and new nodes side by side): read past, not refused.
    auto words = split_words(info);
    if (words.size() < 4) {
      bad("its info '" + info.substr(0, 120) + "' is not '<since> <session> <host> <port> ...'");
      continue;
    }
    long long port = 0;
    try {
      std::size_t used = 0;
      port = std::stoll(words[3], &used);
      if (used != words[3].size()) port = -1;
    } catch (...) {
      port = -1;
    }
    if (port <= 0 || port > 65535) {
      bad("bad port '" + words[3] + "'");
      continue;
    }
    if (!representable_ms(age)) {
      bad("heartbeat age " + std::to_string(age) + " ms is out of range");
      continue;
    }
    if (Duration(milliseconds(age)) > liveness_threshold) continue;  // the one rule
    // The fifth word, when there is one, is the member's app version.
    std::string version = words.size() > 4 ? std::string(words[4]) : std::string();
    if (!validate_app_version(version).ok()) version.clear();
    out.live.push_back(
        Member{id, Address{words[2], static_cast<std::uint16_t>(port)}, milliseconds(age), std::move(version), {}});
  }
  std::sort(out.live.begin(), out.live.end(), [](const Member& a, const Member& b) { return a.id < b.id; });
  return out;
}

void attach_roles(MemberView& members, const RedisReply& view, const RedisReply& roles) {
  std::map<std::string, std::vector<std::string>> by_id;
  for (std::size_t i = 0; 3 * i < view.elements.size() && i < roles.elements.size(); ++i) {
    std::string id, text;
    if (!text_of(view.elements[3 * i], id) || !text_of(roles.elements[i], text)) continue;
    auto list = split_roles(text);
    if (std::all_of(list.begin(), list.end(), [](const std::string& r) { return validate_role(r).ok(); }))
      by_id[id] = std::move(list);
  }
  for (auto& m : members.live)
    if (auto it = by_id.find(m.id); it != by_id.end()) m.roles = it->second;
}

}  // namespace troupe::cluster::detail
