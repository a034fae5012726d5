// The Lua prelude every placement script starts with (times, the liveness
// rule, member versions, assignment records, moves) and the table that
// joins it to each script's body (scripts_membership.cpp,
// scripts_placement.cpp).

#include <array>

#include "scripts.hpp"

namespace troupe::cluster::detail {

namespace {

// Shared by every script. Times are Redis' own clock (TIME), in
// milliseconds; no script ever reads a client's clock.
constexpr std::string_view kPrelude = R"lua(
local P = ARGV[1]
local MEMBERS, INFO, CONFIG, EPOCH, GROUPS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local EVENTS = P .. ':events'
local DRAINING = P .. ':draining'
local ROLES = P .. ':member_roles'
local GROUP_ROLES = P .. ':group_roles'
-- Every member that registered or was given a unit (scored by when it last
-- was), and when a heartbeat
-- first found one with unit sets missing from MEMBERS: such an owner is
-- taken over like an expired one once it has been missing that long.
local OWNERS = P .. ':owners'
local ABSENT = P .. ':absent'

local function int(x) return string.format('%d', x) end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The cluster-wide threshold and margin, written by the first member to
-- register and checked by every later one, so all members apply one rule.
local function read_rule()
  local c = redis.call('HMGET', CONFIG, 'liveness_threshold_ms', 'takeover_margin_ms')
  return tonumber(c[1]), tonumber(c[2])
end

-- Member ids are written by other processes: one that breaks the node id
-- rule is never treated as a member.
local function valid_id(id)
  return #id >= 1 and #id <= 64 and string.find(id, '^[A-Za-z0-9._-]+$') ~= nil
end

local function member_age(id, now)
  local s = redis.call('ZSCORE', MEMBERS, id)
  if not s then return nil end
  return now - tonumber(s)
end

-- THE liveness rule, the only one any check uses: a member is live iff
-- now - last_heartbeat <= threshold.
local function is_live(id, now, T)
  if not valid_id(id) then return false end
  local age = member_age(id, now)
  return age ~= nil and age <= T
end

-- Past threshold + margin a member has certainly fenced itself (it fences
-- at threshold after its last successful heartbeat was sent, which is no
-- later than the stamp): its units may be taken without its release.
local function is_expired(id, now, T, M)
  local age = member_age(id, now)
  return age == nil or age > T + M
end

-- The live members, by the rule above: one bounded range of the sorted set.
local function live_members(now, T)
  local out = {}
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', MEMBERS, int(now - T), '+inf')) do
    if valid_id(id) then out[#out + 1] = id end
  end
  return out
end

local function member_session(id)
  local info = redis.call('HGET', INFO, id)
  if not info then return nil end
  local _, sess = string.match(info, '^(%d+) (%S+)')
  return sess
end

-- Removes a member that holds no unit any more (it left, or was taken
-- over) and tells every node.
local function forget_member(id)
  redis.call('ZREM', MEMBERS, id)
  redis.call('HDEL', INFO, id)
  redis.call('HDEL', DRAINING, id)
  redis.call('HDEL', ROLES, id)
  redis.call('ZREM', OWNERS, id)
  redis.call('HDEL', ABSENT, id)
  redis.call('PUBLISH', EVENTS, 'left ' .. id)
end

-- A member's app version: the fifth word of its info ('' when it declared
-- none, which sorts before every version).
local function member_version(id)
  local info = redis.call('HGET', INFO, id)
  if not info then return '' end
  return string.match(info, '^%d+ %S+ %S+ %S+ (%S+)') or ''
end

-- -1, 0 or 1 as version a sorts before, with or after b: dot-separated
-- parts, numeric ones by value and others as text; a version that is a
-- prefix of another sorts first ('1.2' before '1.2.1').
local function version_cmp(a, b)
  if a == b then return 0 end
  local pa, pb = {}, {}
  for part in string.gmatch(a, '[^.]+') do pa[#pa + 1] = part end
  for part in string.gmatch(b, '[^.]+') do pb[#pb + 1] = part end
  for i = 1, math.max(#pa, #pb) do
    local x, y = pa[i], pb[i]
    if x == nil then return -1 end
    if y == nil then return 1 end
    if x ~= y then
      local nx, ny = tonumber(x), tonumber(y)
      if nx and ny and nx ~= ny then
        if nx < ny then return -1 end
        return 1
      end
      if x < y then return -1 end
      return 1
    end
  end
  return 0
end

-- The members of `ids` (but `exclude`) that run the highest app version
-- among them: while a rolling update runs two versions side by side, what
-- is placed goes to the new one.
local function newest(ids, exclude)
  local best, out = nil, {}
  for _, id in ipairs(ids) do
    if id ~= exclude then
      local v = member_version(id)
      local c = 1
      if best ~= nil then c = version_cmp(v, best) end
      if c > 0 then
        best, out = v, {id}
      elseif c == 0 then
        out[#out + 1] = id
      end
    end
  end
  return out
end

-- A member handing its units off before it leaves (the drain script): it
-- is live, but nothing new is placed on it. The mark holds for the
-- incarnation that set it only.
local function is_draining(id)
  local s = redis.call('HGET', DRAINING, id)
  return s and s == member_session(id)
end

-- The roles that may host `group` as stored ('a,b', or '*': any member),
-- and as a set (nil: any member may).
local function group_roles(group)
  local v = redis.call('HGET', GROUP_ROLES, group)
  local r = v and string.match(v, '^(%S+)') or '*'
  if r == '*' then return r, nil end
  local need = {}
  for role in string.gmatch(r, '[^,]+') do need[role] = true end
  return r, need
end

-- Whether member `id` holds one of the roles in `need` (nil: every member
-- does).
local function holds_role(id, need)
  if need == nil then return true end
  local mine = redis.call('HGET', ROLES, id)
  if not mine then return false end
  for role in string.gmatch(mine, '[^,]+') do
    if need[role] then return true end
  end
  return false
end

-- THE eligibility rule, the only one placement uses: of the live members
-- `ids`, those that may be given units of `group`: not draining, and
-- holding one of the group's roles when it has any.
local function eligible(group, ids)
  local _, need = group_roles(group)
  local out = {}
  for _, id in ipairs(ids) do
    if not is_draining(id) and holds_role(id, need) then out[#out + 1] = id end
  end
  return out
end

-- Records the group roles member `id` declares: ARGV pairs (group, roles)
-- from index `from`, roles being 'a,b' (sorted) or '*'. Each is stored as
-- '<roles> <declarer> ...'. A live other declarer of different roles
-- refuses them all, nothing written: the answer is {group, stored,
-- declared}. With no other declarer live, the new roles replace the old.
local function declare_roles(id, from, now, T)
  local plan = {}
  for i = from, #ARGV - 1, 2 do
    local g, r = ARGV[i], ARGV[i + 1]
    local keep = {id}
    local cur = redis.call('HGET', GROUP_ROLES, g)
    local stored = cur and string.match(cur, '^(%S+)')
    if stored then
      for d in string.gmatch(string.sub(cur, #stored + 1), '%S+') do
        if d ~= id and is_live(d, now, T) then
          if stored ~= r then return {g, stored, r} end
          keep[#keep + 1] = d
        end
      end
    end
    plan[#plan + 1] = {g, r .. ' ' .. table.concat(keep, ' ')}
  end
  for _, p in ipairs(plan) do redis.call('HSET', GROUP_ROLES, p[1], p[2]) end
  return nil
end

local function gkey(group, what) return P .. ':group:' .. group .. ':' .. what end
local function ukey(group, member) return P .. ':group:' .. group .. ':units:' .. member end

local function parse_assign(s)
  if not s then return nil end
  local e, owner, upd = string.match(s, '^(%d+) (%S+) (%d+)$')
  if not e then return nil end
  return {epoch = tonumber(e), owner = owner, updated = tonumber(upd)}
end

local function parse_handoff(s)
  if not s then return nil end
  local prev, e, sess = string.match(s, '^(%S+) (%d+) (%S+)$')
  if not prev then return nil end
  return {prev = prev, epoch = tonumber(e), session = sess}
end

-- A hand-off from `prev` stops holding once that incarnation has expired or
-- was replaced (a new incarnation registers only after the old expired).
local function handoff_over(h, now, T, M)
  return is_expired(h.prev, now, T, M) or member_session(h.prev) ~= h.session
end

-- {owner, epoch, updated, spec, handing_off_from, handoff_epoch} or nil.
local function describe(group, unit, now, T, M)
  local a = parse_assign(redis.call('HGET', gkey(group, 'assign'), unit))
  if not a then return nil end
  local spec = redis.call('HGET', gkey(group, 'spec'), unit) or ''
  local h = parse_handoff(redis.call('HGET', gkey(group, 'handoff'), unit))
  local hf, he = '', 0
  if h and h.prev ~= a.owner and not handoff_over(h, now, T, M) then hf, he = h.prev, h.epoch end
  return {a.owner, a.epoch, a.updated, spec, hf, he}
end

-- Fewest units in the group among `candidates` (ties: smallest id).
local function least_loaded(group, candidates, exclude)
  local best, best_n = nil, nil
  for _, id in ipairs(candidates) do
    if id ~= exclude then
      local n = redis.call('SCARD', ukey(group, id))
      if best == nil or n < best_n or (n == best_n and id < best) then best, best_n = id, n end
    end
  end
  return best
end

-- Whenever a unit gets a new owner `to` (or none, to == ''), record what
-- that owner must wait for: the incarnation that may still run the unit.
local function settle_handoff(group, unit, from, from_epoch, to, now, T, M, from_stopped)
  local hk = gkey(group, 'handoff')
  local raw = redis.call('HGET', hk, unit)
  local h = parse_handoff(raw)
  if h and not handoff_over(h, now, T, M) then
    -- An earlier owner may still run it; `from` was waiting and never did.
    -- Back to that earlier owner, nobody else may run it: nothing to wait for.
    if h.prev == to then redis.call('HDEL', hk, unit) end
    return
  end
  if from and from ~= to and not from_stopped and not is_expired(from, now, T, M) then
    local sess = member_session(from)
    if sess then
      redis.call('HSET', hk, unit, from .. ' ' .. int(from_epoch) .. ' ' .. sess)
      return
    end
  end
  if raw then redis.call('HDEL', hk, unit) end
end

-- Owner, member lists, epoch and update time change together.
local function move(group, unit, from, from_epoch, to, now, T, M, from_stopped)
  local e = redis.call('INCR', EPOCH)
  if from then redis.call('SREM', ukey(group, from), unit) end
  redis.call('SADD', ukey(group, to), unit)
  redis.call('ZADD', OWNERS, int(now), to)
  redis.call('HSET', gkey(group, 'assign'), unit, int(e) .. ' ' .. to .. ' ' .. int(now))
  settle_handoff(group, unit, from, from_epoch, to, now, T, M, from_stopped)
  return e
end
)lua";

struct Entry {
  std::string_view name;
  std::string_view body;
};

// Built on first use: the bodies are defined in other files.
const std::array<Entry, script_count>& scripts() {
  static const std::array<Entry, script_count> table = {{
      {"heartbeat", lua::heartbeat},
      {"takeover", lua::takeover},
      {"assign", lua::assign},
      {"relocate", lua::relocate},
      {"unassign", lua::unassign},
      {"set_spec", lua::set_spec},
      {"my_units", lua::my_units},
      {"release", lua::release},
      {"rebalance", lua::rebalance},
      {"lookup", lua::lookup},
      {"leave", lua::leave},
      {"snapshot", lua::snapshot},
      {"drain", lua::drain},
      {"declare", lua::declare},
  }};
  return table;
}

}  // namespace

const std::string& script_text(Script s) {
  static const std::array<std::string, script_count> texts = [] {
    std::array<std::string, script_count> t;
    for (std::size_t i = 0; i < script_count; ++i)
      t[i] = "-- troupe " + std::string(scripts()[i].name) + "\n" + std::string(kPrelude) +
             std::string(scripts()[i].body);
    return t;
  }();
  return texts[static_cast<std::size_t>(s)];
}

std::string_view script_name(Script s) { return scripts()[static_cast<std::size_t>(s)].name; }

}  // namespace troupe::cluster::detail
