// The Lua scripts that place single units and read placement state:
// assign (W3), relocate (W4), unassign, set_spec, my_units, release,
// rebalance (W6), lookup and snapshot. Each runs after the shared prelude
// (scripts.cpp); doc/redis.md describes their inputs and outcomes.

#include "scripts.hpp"

namespace troupe::cluster::detail::lua {

// ARGV: [2] group [3] unit [4] spec [5] notify ('1' publishes)
const std::string_view assign = R"lua(
local now = now_ms()
local T, M = read_rule()
if not T or not M then return {'NO_CONFIG'} end
local group, unit = ARGV[2], ARGV[3]
local d = describe(group, unit, now, T, M)
if d then return {'ALREADY_INSTALLED', d} end
local live = live_members(now, T)
local ids = eligible(group, live)
if #ids == 0 then return {'NO_ACCEPTABLE_WORKER', (group_roles(group)), #live} end
local to = least_loaded(group, newest(ids, nil), nil)
move(group, unit, nil, 0, to, now, T, M, false)
redis.call('HSET', gkey(group, 'spec'), unit, ARGV[4])
redis.call('SADD', GROUPS, group)
if ARGV[5] == '1' then redis.call('PUBLISH', EVENTS, 'changed ' .. group) end
return {'ASSIGNED', describe(group, unit, now, T, M)}
)lua";

// ARGV: [2] group [3] unit [4] force ('1') [5] notify
const std::string_view relocate = R"lua(
local now = now_ms()
local T, M = read_rule()
if not T or not M then return {'NO_CONFIG'} end
local group, unit = ARGV[2], ARGV[3]
local ids = live_members(now, T)
local roles, need = group_roles(group)
if #ids == 0 then return {'NO_ACCEPTABLE_WORKER', roles, 0} end
local a = parse_assign(redis.call('HGET', gkey(group, 'assign'), unit))
if not a then return {'NOT_INSTALLED'} end
-- An owner that is live but no longer holds a role of the group (it came
-- back without it) is relocated like a dead one.
if ARGV[4] ~= '1' and is_live(a.owner, now, T) and holds_role(a.owner, need) then
  return {'NO_NEED_TO_RELOCATE', describe(group, unit, now, T, M)}
end
local to = least_loaded(group, newest(eligible(group, ids), a.owner), a.owner)
if not to then return {'NO_OTHER_ACCEPTABLE_WORKER', describe(group, unit, now, T, M), roles} end
move(group, unit, a.owner, a.epoch, to, now, T, M, false)
if ARGV[5] == '1' then redis.call('PUBLISH', EVENTS, 'moved ' .. group) end
return {'RELOCATED', describe(group, unit, now, T, M)}
)lua";

// ARGV: [2] group [3] unit [4] notify
const std::string_view unassign = R"lua(
local now = now_ms()
local T, M = read_rule()
if not T or not M then return {'NO_CONFIG'} end
local group, unit = ARGV[2], ARGV[3]
local a = parse_assign(redis.call('HGET', gkey(group, 'assign'), unit))
if not a then return {'NOT_INSTALLED'} end
redis.call('SREM', ukey(group, a.owner), unit)
redis.call('HDEL', gkey(group, 'assign'), unit)
redis.call('HDEL', gkey(group, 'spec'), unit)
-- The owner may still be running it: a later assignment waits for its release.
settle_handoff(group, unit, a.owner, a.epoch, '', now, T, M, false)
if redis.call('HLEN', gkey(group, 'assign')) == 0 then redis.call('SREM', GROUPS, group) end
if ARGV[4] == '1' then redis.call('PUBLISH', EVENTS, 'changed ' .. group) end
return {'UNASSIGNED', a.owner, a.epoch}
)lua";

// ARGV: [2] group [3] unit [4] spec [5] notify
const std::string_view set_spec = R"lua(
local now = now_ms()
local T, M = read_rule()
if not T or not M then return {'NO_CONFIG'} end
local group, unit = ARGV[2], ARGV[3]
local a = parse_assign(redis.call('HGET', gkey(group, 'assign'), unit))
if not a then return {'NOT_INSTALLED'} end
if redis.call('HGET', gkey(group, 'spec'), unit) == ARGV[4] then
  return {'UNCHANGED', describe(group, unit, now, T, M)}
end
redis.call('HSET', gkey(group, 'spec'), unit, ARGV[4])
redis.call('HSET', gkey(group, 'assign'), unit, int(a.epoch) .. ' ' .. a.owner .. ' ' .. int(now))
if ARGV[5] == '1' then redis.call('PUBLISH', EVENTS, 'changed ' .. group) end
return {'UPDATED', describe(group, unit, now, T, M)}
)lua";

// ARGV: [2] group [3] member
const std::string_view my_units = R"lua(
local now = now_ms()
local T, M = read_rule()
if not T or not M then return {'NO_CONFIG'} end
local group, me = ARGV[2], ARGV[3]
local set = ukey(group, me)
local hk = gkey(group, 'handoff')
local out = {}
for _, unit in ipairs(redis.call('SMEMBERS', set)) do
  local a = parse_assign(redis.call('HGET', gkey(group, 'assign'), unit))
  if a and a.owner == me then
    local spec = redis.call('HGET', gkey(group, 'spec'), unit) or ''
    local wait_for, wait_epoch = '', 0
    local raw = redis.call('HGET', hk, unit)
    if raw then
      local h = parse_handoff(raw)
      if h and h.prev ~= me and not handoff_over(h, now, T, M) then
        wait_for, wait_epoch = h.prev, h.epoch
      else
        redis.call('HDEL', hk, unit)
      end
    end
    out[#out + 1] = {unit, a.epoch, spec, wait_for, wait_epoch}
  else
    -- The assignment says otherwise: the set entry is stale.
    redis.call('SREM', set, unit)
  end
end
return {'OK', now, out}
)lua";

// ARGV: [2] group [3] member [4] session [5..] pairs of a unit and the
// epoch it ran under. One call releases a batch and publishes one notice
// naming the units released, so a rebalance that stops thousands of units
// costs the cluster a notice per batch, not per unit.
const std::string_view release = R"lua(
local hk = gkey(ARGV[2], 'handoff')
local done, names = {}, {}
for i = 5, #ARGV - 1, 2 do
  local unit = ARGV[i]
  if redis.call('HGET', hk, unit) == ARGV[3] .. ' ' .. ARGV[i + 1] .. ' ' .. ARGV[4] then
    redis.call('HDEL', hk, unit)
    done[#done + 1] = 1
    names[#names + 1] = unit
  else
    done[#done + 1] = 0
  end
end
if #names > 0 then
  redis.call('PUBLISH', EVENTS, 'released ' .. ARGV[2] .. ' ' .. table.concat(names, ' '))
end
return {'OK', done}
)lua";

// ARGV: [2] group [3] notify
//
// While the live members run more than one app version (a rolling update,
// or a member that declared none beside one that did) nothing moves: the
// answer is VERSIONS_MIXED with the versions, oldest first. Placement
// already sends new and handed-off units to the newest members, and moving
// units onto members about to be replaced would move them twice.
//
// Only eligible members (the prelude's rule: live, not draining, holding a
// role of the group when it has any) are balanced over. The units of a
// live member that is not eligible (it holds none of the group's roles)
// must move, like a dead member's: they go first.
//
// Targets: with n units (those of eligible members and those that must
// move) over k eligible members, q = n / k and r = n % k; the r members
// holding the most units keep q + 1, the others q. Only units above a
// member's target move, besides those that must, so the number of moves is
// those plus the total surplus, which no balanced placement can beat: any
// placement with max - min <= 1 gives r members q + 1 and the rest q, and
// giving the q + 1 targets to the largest members minimises the surplus.
const std::string_view rebalance = R"lua(
local now = now_ms()
local T, M = read_rule()
if not T or not M then return {'NO_CONFIG'} end
local group = ARGV[2]
local ids = live_members(now, T)
if #ids == 0 then return {'NO_ACCEPTABLE_WORKER', (group_roles(group)), 0} end
local versions, seen = {}, {}
for _, id in ipairs(ids) do
  local v = member_version(id)
  if not seen[v] then
    seen[v] = true
    versions[#versions + 1] = v
  end
end
if #versions > 1 then
  table.sort(versions, function(x, y) return version_cmp(x, y) < 0 end)
  return {'VERSIONS_MIXED', versions}
end
-- A draining member is neither given units nor relieved of them: its
-- hand-off moves them.
local live = ids
ids = eligible(group, live)
if #ids == 0 then return {'NO_ACCEPTABLE_WORKER', (group_roles(group)), #live} end
local pool, is_eligible = {}, {}
for _, id in ipairs(ids) do is_eligible[id] = true end
for _, id in ipairs(live) do
  if not is_eligible[id] and not is_draining(id) then
    local units = redis.call('SMEMBERS', ukey(group, id))
    table.sort(units)
    for _, unit in ipairs(units) do
      local a = parse_assign(redis.call('HGET', gkey(group, 'assign'), unit))
      if a and a.owner == id then
        pool[#pool + 1] = {unit, id}
      else
        redis.call('SREM', ukey(group, id), unit)
      end
    end
  end
end
local rows, n = {}, #pool
for _, id in ipairs(ids) do
  local c = redis.call('SCARD', ukey(group, id))
  rows[#rows + 1] = {id = id, count = c}
  n = n + c
end
table.sort(rows, function(x, y)
  if x.count ~= y.count then return x.count > y.count end
  return x.id < y.id
end)
local k = #rows
local q = math.floor(n / k)
local r = n - q * k
for i, row in ipairs(rows) do
  if i <= r then row.target = q + 1 else row.target = q end
  local surplus = row.count - row.target
  if surplus > 0 then
    local units = redis.call('SMEMBERS', ukey(group, row.id))
    table.sort(units)
    for j = 1, surplus do pool[#pool + 1] = {units[j], row.id} end
  end
end
-- At most ARGV[4] moves per call when it is above 0 (seed 001's cap):
-- the rest are left for the next call, and counted.
local cap = tonumber(ARGV[4] or '0') or 0
local moves, p = {}, 1
for _, row in ipairs(rows) do
  local need = row.target - row.count
  while need > 0 and p <= #pool and (cap <= 0 or #moves < cap) do
    local unit, from = pool[p][1], pool[p][2]
    p = p + 1
    local a = parse_assign(redis.call('HGET', gkey(group, 'assign'), unit))
    local e = move(group, unit, from, a and a.epoch or 0, row.id, now, T, M, false)
    moves[#moves + 1] = {unit, from, row.id, e}
    need = need - 1
  end
end
if #moves > 0 and ARGV[3] == '1' then redis.call('PUBLISH', EVENTS, 'moved ' .. group) end
return {'OK', moves, #pool - #moves}
)lua";

// ARGV: [2] group [3] unit
const std::string_view lookup = R"lua(
local now = now_ms()
local T, M = read_rule()
if not T or not M then return {'NO_CONFIG'} end
local d = describe(ARGV[2], ARGV[3], now, T, M)
if not d then return {'NOT_INSTALLED'} end
return {'OK', d}
)lua";

// ARGV: [2] group
const std::string_view snapshot = R"lua(
local now = now_ms()
local T, M = read_rule()
local group = ARGV[2]
local hk, ak = gkey(group, 'handoff'), gkey(group, 'assign')
if T and M then
  -- Hand-offs of units no longer assigned, whose previous owner is gone:
  -- nothing else would ever clear them.
  local hs = redis.call('HGETALL', hk)
  for i = 1, #hs, 2 do
    if redis.call('HEXISTS', ak, hs[i]) == 0 then
      local h = parse_handoff(hs[i + 1])
      if not h or handoff_over(h, now, T, M) then redis.call('HDEL', hk, hs[i]) end
    end
  end
end
return {'OK', redis.call('HGETALL', gkey(group, 'spec'))}
)lua";

}  // namespace troupe::cluster::detail::lua
