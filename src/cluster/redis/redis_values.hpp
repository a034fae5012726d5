#pragma once
// The values the coordinator reads out of Redis replies: texts, integers,
// a unit's assignment and the member view of a heartbeat. Whatever is
// stored in Redis (by another troupe version, an operator, a damaged
// restore) comes through these; each refuses what it cannot read rather
// than guess. Pure functions, internal to src/cluster/redis/ (and its
// fuzz target); safe from any thread.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "redis_connection.hpp"
#include "troupe/cluster/coordinator.hpp"

namespace troupe::cluster::detail {

// A status or string reply's text.
bool text_of(const RedisReply& r, std::string& out);
// An integer reply, or a string reply that is a whole decimal number.
bool int_of(const RedisReply& r, long long& out);
// The words of `s` separated by runs of spaces.
std::vector<std::string> split_words(std::string_view s);

// Roles as stored in Redis: sorted, each once, joined by ','; `none` when
// there are none. The inverse splits at ',' (empty parts dropped).
std::string roles_text(std::vector<std::string> roles, std::string_view none);
std::vector<std::string> split_roles(std::string_view text);

// What a NO_ACCEPTABLE_WORKER or NO_OTHER_ACCEPTABLE_WORKER answer says
// of the group's roles (element `roles_at`, '*' for none) and of the live
// members (element `live_at`, if any): " (only members holding role a or
// b may host it; 3 live members hold none)", or "" when the group names no
// roles.
std::string eligibility_note(const RedisReply& rep, std::size_t roles_at, std::size_t live_at);

// An assignment as the placement scripts return it:
// [owner, epoch, updated_ms, spec, handing_off_from, handoff_epoch].
std::optional<Assignment> parse_assignment(const RedisReply& d, const std::string& group, const std::string& unit);

// A heartbeat's member view: flat triples [id, heartbeat age ms, info], info
// being "<since> <session> <host> <port>", and perhaps more words after it,
// which are a later version's and are read past. Members older than
// `liveness_threshold` are left out; entries that do not read are skipped
// with the reason (the coordinator warns once per entry).
struct SkippedMember {
  std::string id, info, why;
};
struct MemberView {
  std::vector<Member> live;  // sorted by id
  std::vector<SkippedMember> skipped;
};
MemberView parse_members(const RedisReply& view, Duration liveness_threshold);
// The heartbeat's roles of the same members, one text per triple of
// `view`, set on the members of `members` (those that do not read as
// roles are left empty).
void attach_roles(MemberView& members, const RedisReply& view, const RedisReply& roles);

}  // namespace troupe::cluster::detail
