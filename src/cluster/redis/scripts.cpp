#include "scripts.hpp"

#include <array>

namespace troupe::cluster::detail {

namespace {

// Shared by every script. Times are Redis' own clock (TIME), in
// milliseconds; no script ever reads a client's clock.
constexpr std::string_view kPrelude = R"lua(
local P = ARGV[1]
local MEMBERS, INFO, CONFIG, EPOCH, GROUPS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local EVENTS = P .. ':events'
local DRAINING = P .. ':draining'

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

-- The members of `ids` that may be given units: all but the draining ones.
local function placeable(ids)
  local out = {}
  for _, id in ipairs(ids) do
    if not is_draining(id) then out[#out + 1] = id end
  end
  return out
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
  if h and h.prev ~= to and not handoff_over(h, now, T, M) then
    -- An earlier owner may still run it; `from` was waiting and never did.
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
  redis.call('HSET', gkey(group, 'assign'), unit, int(e) .. ' ' .. to .. ' ' .. int(now))
  settle_handoff(group, unit, from, from_epoch, to, now, T, M, from_stopped)
  return e
end
)lua";

// ARGV: [2] id [3] session [4] host [5] port [6] 'register'|'beat'
//       [7] threshold ms [8] margin ms [9] lowest epoch seen [10] dead batch
//       [11] app version (may be empty)
constexpr std::string_view kHeartbeat = R"lua(
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
  for _, other in ipairs(live_members(now, T)) do
    if other ~= id then others = others + 1 end
  end
  redis.call('ZADD', MEMBERS, int(now), id)
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
local view = {}
for i = 1, #all, 2 do
  local m = all[i]
  view[#view + 1] = m
  view[#view + 1] = now - tonumber(all[i + 1])
  view[#view + 1] = redis.call('HGET', INFO, m) or ''
end
-- Only a member registered for threshold + margin takes over others: after
-- an outage of Redis itself every member gets that long to come back.
local dead = {}
if now - since >= T + M then
  dead = redis.call('ZRANGEBYSCORE', MEMBERS, '-inf', '(' .. int(now - T - M), 'LIMIT', 0, tonumber(ARGV[10]))
end
return {'OK', now, since, others, view, dead}
)lua";

// ARGV: [2] caller id [3] caller session [4] batch [5..] expired candidates
constexpr std::string_view kTakeover = R"lua(
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
  -- Still a member and still expired: a second taker finds nothing to do.
  if dead ~= caller and redis.call('ZSCORE', MEMBERS, dead) and is_expired(dead, now, T, M) then
    local left = false
    local heirs = newest(placeable(targets), dead)
    for _, g in ipairs(groups) do
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
      more = 1
    else
      redis.call('ZREM', MEMBERS, dead)
      redis.call('HDEL', INFO, dead)
      redis.call('HDEL', DRAINING, dead)
      redis.call('PUBLISH', EVENTS, 'left ' .. dead)
    end
  end
end
return {'OK', more, moves}
)lua";

// ARGV: [2] group [3] unit [4] spec [5] notify ('1' publishes)
constexpr std::string_view kAssign = R"lua(
local now = now_ms()
local T, M = read_rule()
if not T or not M then return {'NO_CONFIG'} end
local group, unit = ARGV[2], ARGV[3]
local d = describe(group, unit, now, T, M)
if d then return {'ALREADY_INSTALLED', d} end
local ids = placeable(live_members(now, T))
if #ids == 0 then return {'NO_ACCEPTABLE_WORKER'} end
local to = least_loaded(group, newest(ids, nil), nil)
move(group, unit, nil, 0, to, now, T, M, false)
redis.call('HSET', gkey(group, 'spec'), unit, ARGV[4])
redis.call('SADD', GROUPS, group)
if ARGV[5] == '1' then redis.call('PUBLISH', EVENTS, 'changed ' .. group) end
return {'ASSIGNED', describe(group, unit, now, T, M)}
)lua";

// ARGV: [2] group [3] unit [4] force ('1') [5] notify
constexpr std::string_view kRelocate = R"lua(
local now = now_ms()
local T, M = read_rule()
if not T or not M then return {'NO_CONFIG'} end
local group, unit = ARGV[2], ARGV[3]
local ids = live_members(now, T)
if #ids == 0 then return {'NO_ACCEPTABLE_WORKER'} end
local a = parse_assign(redis.call('HGET', gkey(group, 'assign'), unit))
if not a then return {'NOT_INSTALLED'} end
if ARGV[4] ~= '1' and is_live(a.owner, now, T) then
  return {'NO_NEED_TO_RELOCATE', describe(group, unit, now, T, M)}
end
local to = least_loaded(group, newest(placeable(ids), a.owner), a.owner)
if not to then return {'NO_OTHER_ACCEPTABLE_WORKER', describe(group, unit, now, T, M)} end
move(group, unit, a.owner, a.epoch, to, now, T, M, false)
if ARGV[5] == '1' then redis.call('PUBLISH', EVENTS, 'moved ' .. group) end
return {'RELOCATED', describe(group, unit, now, T, M)}
)lua";

// ARGV: [2] group [3] unit [4] notify
constexpr std::string_view kUnassign = R"lua(
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
constexpr std::string_view kSetSpec = R"lua(
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
constexpr std::string_view kMyUnits = R"lua(
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

// ARGV: [2] group [3] unit [4] member [5] epoch [6] session
constexpr std::string_view kRelease = R"lua(
local hk = gkey(ARGV[2], 'handoff')
if redis.call('HGET', hk, ARGV[3]) == ARGV[4] .. ' ' .. ARGV[5] .. ' ' .. ARGV[6] then
  redis.call('HDEL', hk, ARGV[3])
  redis.call('PUBLISH', EVENTS, 'released ' .. ARGV[2] .. ' ' .. ARGV[3])
  return {'RELEASED'}
end
return {'NOT_HANDED_OFF'}
)lua";

// ARGV: [2] group [3] notify
//
// While the live members run more than one app version (a rolling update,
// or a member that declared none beside one that did) nothing moves: the
// answer is VERSIONS_MIXED with the versions, oldest first. Placement
// already sends new and handed-off units to the newest members, and moving
// units onto members about to be replaced would move them twice.
//
// Targets: with n units on k live members, q = n / k and r = n % k; the r
// members holding the most units keep q + 1, the others q. Only units above
// a member's target move, so the number of moves is the total surplus,
// which no balanced placement can beat: any placement with max - min <= 1
// gives r members q + 1 and the rest q, and giving the q + 1 targets to the
// largest members minimises the surplus.
constexpr std::string_view kRebalance = R"lua(
local now = now_ms()
local T, M = read_rule()
if not T or not M then return {'NO_CONFIG'} end
local group = ARGV[2]
local ids = live_members(now, T)
if #ids == 0 then return {'NO_ACCEPTABLE_WORKER'} end
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
ids = placeable(ids)
if #ids == 0 then return {'NO_ACCEPTABLE_WORKER'} end
local rows, n = {}, 0
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
local pool = {}
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
constexpr std::string_view kLookup = R"lua(
local now = now_ms()
local T, M = read_rule()
if not T or not M then return {'NO_CONFIG'} end
local d = describe(ARGV[2], ARGV[3], now, T, M)
if not d then return {'NOT_INSTALLED'} end
return {'OK', d}
)lua";

// ARGV: [2] member [3] session. The member has stopped every unit already,
// so no hand-off is recorded from it.
constexpr std::string_view kLeave = R"lua(
local now = now_ms()
local T, M = read_rule()
if not T or not M then return {'NO_CONFIG'} end
local me = ARGV[2]
if member_session(me) ~= ARGV[3] then return {'NOT_MEMBER'} end
local ids = newest(placeable(live_members(now, T)), me)
local kept, moves = 0, {}
for _, g in ipairs(redis.call('SMEMBERS', GROUPS)) do
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
if kept == 0 then
  redis.call('ZREM', MEMBERS, me)
  redis.call('HDEL', INFO, me)
  redis.call('HDEL', DRAINING, me)
  redis.call('PUBLISH', EVENTS, 'left ' .. me)
end
return {'OK', kept, moves}
)lua";

// ARGV: [2] group
constexpr std::string_view kSnapshot = R"lua(
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

// ARGV: [2] member [3] session
// Marks the member as draining: assign, relocate, takeover and leave place
// nothing more on it, so that it can hand its units off before it leaves.
constexpr std::string_view kDrain = R"lua(
local me = ARGV[2]
if member_session(me) ~= ARGV[3] then return {'NOT_MEMBER'} end
redis.call('HSET', DRAINING, me, ARGV[3])
return {'OK'}
)lua";

struct Entry {
  std::string_view name;
  std::string_view body;
};

constexpr std::array<Entry, script_count> kScripts = {{
    {"heartbeat", kHeartbeat},
    {"takeover", kTakeover},
    {"assign", kAssign},
    {"relocate", kRelocate},
    {"unassign", kUnassign},
    {"set_spec", kSetSpec},
    {"my_units", kMyUnits},
    {"release", kRelease},
    {"rebalance", kRebalance},
    {"lookup", kLookup},
    {"leave", kLeave},
    {"snapshot", kSnapshot},
    {"drain", kDrain},
}};

}  // namespace

const std::string& script_text(Script s) {
  static const std::array<std::string, script_count> texts = [] {
    std::array<std::string, script_count> t;
    for (std::size_t i = 0; i < script_count; ++i)
      t[i] = "-- troupe " + std::string(kScripts[i].name) + "\n" + std::string(kPrelude) +
             std::string(kScripts[i].body);
    return t;
  }();
  return texts[static_cast<std::size_t>(s)];
}

std::string_view script_name(Script s) { return kScripts[static_cast<std::size_t>(s)].name; }

}  // namespace troupe::cluster::detail
