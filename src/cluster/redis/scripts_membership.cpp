// The Lua scripts of membership: heartbeat (register or renew, the member
// view, the expired members to take over), takeover, drain and leave. Each
// runs after the shared prelude (scripts.cpp); doc/redis.md describes their
// inputs and outcomes.

#include "scripts.hpp"

namespace troupe::cluster::detail::lua {

// ARGV: [2] id [3] session [4] host [5] port [6] 'register'|'beat'
//       [7] threshold ms [8] margin ms [9] lowest epoch seen [10] dead batch
//       [11] app version (may be empty) [12] this member's roles ('a,b'; may
//       be empty) [13..] when registering: pairs of a group and the roles
//       that may host it ('a,b', or '*': any member)
const std::string_view heartbeat = R"lua(
local id, session, mode = ARGV[2], ARGV[3], ARGV[6]
local T, M = tonumber(ARGV[7]), tonumber(ARGV[8])
local now = now_ms()
local cT, cM = read_rule()
if cT == nil or cM == nil then
  redis.call('HSET', CONFIG, 'liveness_threshold_ms', int(T), 'takeover_margin_ms', int(M))
elseif cT ~= T or cM ~= M then
  return {'CONFIG_MISMATCH', now, cT, cM}
end
local info = redis.call('HGET', INFO, id)
local stamp = redis.call('ZSCORE', MEMBERS, id)
local since, others = now, 0
if mode == 'beat' then
  if not info or not stamp then return {'GONE', now} end
  local s, sess = string.match(info, '^(%d+) (%S+)')
  if sess ~= session then return {'SUPERSEDED', now} end
  since = tonumber(s)
  redis.call('ZADD', MEMBERS, int(now), id)
else
  if info and stamp then
    local _, sess = string.match(info, '^(%d+) (%S+)')
    local age = now - tonumber(stamp)
    if sess ~= session and age <= T + M then return {'IN_USE', now, age} end
  end
  local clash = declare_roles(id, 13, now, T)
  if clash then return {'ROLES_MISMATCH', now, clash[1], clash[2], clash[3]} end
  if (ARGV[12] or '') ~= '' then
    redis.call('HSET', ROLES, id, ARGV[12])
  else
    redis.call('HDEL', ROLES, id)
  end
  for _, other in ipairs(live_members(now, T)) do
    if other ~= id then others = others + 1 end
  end
  redis.call('ZADD', MEMBERS, int(now), id)
  redis.call('ZADD', OWNERS, int(now), id)
  redis.call('HDEL', ABSENT, id)
  -- A new incarnation is not draining; the same one registering again
  -- (after a fence) still is.
  if redis.call('HGET', DRAINING, id) ~= session then redis.call('HDEL', DRAINING, id) end
  local version = ARGV[11] or ''
  if version ~= '' then version = ' ' .. version end
  redis.call('HSET', INFO, id, int(now) .. ' ' .. session .. ' ' .. ARGV[4] .. ' ' .. ARGV[5] .. version)
  -- Epochs never go back, even if Redis lost its data: members bring the
  -- highest epoch they have seen.
  local floor = tonumber(ARGV[9])
  if floor > (tonumber(redis.call('GET', EPOCH)) or 0) then redis.call('SET', EPOCH, int(floor)) end
end
local all = redis.call('ZRANGE', MEMBERS, 0, -1, 'WITHSCORES')
local view, roles = {}, {}
for i = 1, #all, 2 do
  local m = all[i]
  view[#view + 1] = m
  view[#view + 1] = now - tonumber(all[i + 1])
  view[#view + 1] = redis.call('HGET', INFO, m) or ''
  roles[#roles + 1] = redis.call('HGET', ROLES, m) or ''
end
-- Only a member registered for threshold + margin takes over others: after
-- an outage of Redis itself every member gets that long to come back.
local dead = {}
if now - since >= T + M then
  dead = redis.call('ZRANGEBYSCORE', MEMBERS, '-inf', '(' .. int(now - T - M), 'LIMIT', 0, tonumber(ARGV[10]))
end
-- Owners missing from MEMBERS altogether (their entry deleted by hand, or
-- lost with part of Redis' data): the first heartbeat to see one stamps
-- when; past threshold + margin from then it is taken over like an
-- expired member (it fenced by then: a heartbeat of its own answers GONE,
-- and its last one that succeeded was sent before the entry went). An
-- owner with no unit left is forgotten.
for _, o in ipairs(redis.call('ZRANGE', OWNERS, 0, -1)) do
  if not redis.call('ZSCORE', MEMBERS, o) then
    local holds = false
    for _, g in ipairs(redis.call('SMEMBERS', GROUPS)) do
      if redis.call('SCARD', ukey(g, o)) > 0 then
        holds = true
        break
      end
    end
    local first = tonumber(redis.call('HGET', ABSENT, o) or '')
    if not holds then
      redis.call('ZREM', OWNERS, o)
      redis.call('HDEL', ABSENT, o)
    elseif not first then
      redis.call('HSET', ABSENT, o, int(now))
    elseif now - first > T + M and now - since >= T + M and #dead < tonumber(ARGV[10]) then
      dead[#dead + 1] = o
    end
  end
end
return {'OK', now, since, others, view, dead, roles}
)lua";

// ARGV: [2] caller id [3] caller session [4] batch [5..] expired candidates
const std::string_view takeover = R"lua(
local now = now_ms()
local T, M = read_rule()
if not T or not M then return {'NO_CONFIG'} end
local caller = ARGV[2]
local info = redis.call('HGET', INFO, caller)
local s, sess
if info then s, sess = string.match(info, '^(%d+) (%S+)') end
if not s or sess ~= ARGV[3] or not is_live(caller, now, T) or now - tonumber(s) < T + M then
  return {'NOT_ELIGIBLE'}
end
local budget = tonumber(ARGV[4])
local targets = live_members(now, T)
local groups = redis.call('SMEMBERS', GROUPS)
local moves, more = {}, 0
for i = 5, #ARGV do
  local dead = ARGV[i]
  -- Still a member and still expired, or still missing from the members
  -- for threshold + margin: a second taker finds nothing to do.
  local missing_since = nil
  if not redis.call('ZSCORE', MEMBERS, dead) then missing_since = tonumber(redis.call('HGET', ABSENT, dead) or '') end
  local gone = missing_since ~= nil and now - missing_since > T + M
  if dead ~= caller and (gone or (redis.call('ZSCORE', MEMBERS, dead) and is_expired(dead, now, T, M))) then
    local left = false
    for _, g in ipairs(groups) do
      local heirs = newest(eligible(g, targets), dead)
      local set = ukey(g, dead)
      if budget > 0 then
        local moved = 0
        for _, unit in ipairs(redis.call('SRANDMEMBER', set, budget)) do
          local a = parse_assign(redis.call('HGET', gkey(g, 'assign'), unit))
          if a and a.owner == dead then
            local to = least_loaded(g, heirs, dead)
            if to then
              local e = move(g, unit, dead, a.epoch, to, now, T, M, false)
              moves[#moves + 1] = {g, unit, dead, to, e}
              moved = moved + 1
              budget = budget - 1
            end
          else
            redis.call('SREM', set, unit)
          end
        end
        if moved > 0 then redis.call('PUBLISH', EVENTS, 'moved ' .. g) end
      end
      if redis.call('SCARD', set) > 0 then left = true end
    end
    if left then
      -- Units left with budget to spare have no eligible heir: the next
      -- heartbeat tries again, not an immediate rerun.
      if budget <= 0 then more = 1 end
    else
      forget_member(dead)
    end
  end
end
return {'OK', more, moves}
)lua";

// ARGV: [2] member [3] session. The member has stopped every unit already,
// so no hand-off is recorded from it.
const std::string_view leave = R"lua(
local now = now_ms()
local T, M = read_rule()
if not T or not M then return {'NO_CONFIG'} end
local me = ARGV[2]
if member_session(me) ~= ARGV[3] then return {'NOT_MEMBER'} end
local live = live_members(now, T)
local kept, moves = 0, {}
for _, g in ipairs(redis.call('SMEMBERS', GROUPS)) do
  local ids = newest(eligible(g, live), me)
  local set = ukey(g, me)
  local moved = 0
  for _, unit in ipairs(redis.call('SMEMBERS', set)) do
    local a = parse_assign(redis.call('HGET', gkey(g, 'assign'), unit))
    if a and a.owner == me then
      local to = least_loaded(g, ids, me)
      if to then
        local e = move(g, unit, me, a.epoch, to, now, T, M, true)
        moves[#moves + 1] = {g, unit, me, to, e}
        moved = moved + 1
      else
        kept = kept + 1
      end
    else
      redis.call('SREM', set, unit)
    end
  end
  if moved > 0 then redis.call('PUBLISH', EVENTS, 'moved ' .. g) end
end
-- With units nobody could take, stay a member: the heartbeat stops, the
-- entry expires, and a later member takes them over.
if kept == 0 then forget_member(me) end
return {'OK', kept, moves}
)lua";

// ARGV: [2] member [3] session
// Marks the member as draining: assign, relocate, takeover and leave place
// nothing more on it, so that it can hand its units off before it leaves.
const std::string_view drain = R"lua(
local me = ARGV[2]
if member_session(me) ~= ARGV[3] then return {'NOT_MEMBER'} end
redis.call('HSET', DRAINING, me, ARGV[3])
return {'OK'}
)lua";

// ARGV: [2] member [3] session [4..] pairs of a group and its roles, as the
// heartbeat's [13..]. A group served after start-up declares its roles
// here, under the rule registration applies.
const std::string_view declare = R"lua(
local now = now_ms()
local T, M = read_rule()
if not T or not M then return {'NO_CONFIG'} end
local me = ARGV[2]
if member_session(me) ~= ARGV[3] then return {'NOT_MEMBER'} end
local clash = declare_roles(me, 4, now, T)
if clash then return {'ROLES_MISMATCH', clash[1], clash[2], clash[3]} end
return {'OK'}
)lua";

}  // namespace troupe::cluster::detail::lua
