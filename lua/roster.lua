#!lua flags=allow-oom
-- roster.lua: the replica roster. Every gateway's pump records itself here each tick
-- (while its store answers) with the slice of the batch it would admit per tick if it were cut
-- off from Redis (`slice.rs`), and removes itself on a clean shutdown. The answers: instances
-- seen within the live window (the replica count), within the longer recent window, and the
-- slices recorded by the instances that are recent but not live: they stopped registering, may
-- be cut off and pacing, and the pumps admit that much less.
--
-- A member that stopped registering is dropped at once, instead of being held back for the
-- recent window, when it is known to be gone:
-- - dead: its presence connection (a subscription to its own channel, immune to the server's
--   idle `timeout`) was seen on this very server process (same run_id) at a registration, and
--   is gone now. A process that exits or is killed closes its connections and the server sees
--   it at once; a replica cut off by a partition leaves them open until TCP keep-alive gives up
--   (the gateway uses this only when `tcp-keepalive` outlasts its pacing window);
-- - retired: a newer instance registered with the same replica name (a restarted replica).
--
-- Slices: the recorded slices are disjoint. An instance asks for a slice (the seat this script
-- last told it, `desired`) and is recorded with the largest piece of it that no other member
-- holds and that contains what it held of it; the gateway paces with what it held of the slice
-- it asked for when an answer is lost, which the roster then holds either way.
--
-- The roster also carries each instance's heartbeat credit: how long its users could not
-- heartbeat through it (a store outage, or polls it refused for saturation). Every pump's sweep
-- credits the largest one the live instances report.
--
-- KEYS[1] queue:instances  ZSET member -> last seen (ms); a key of its own (own slot). Members:
--         "<id>|<start>:<end>|<n>" (a slice, and the whole users per tick it holds of this
--         version's batch, for gateways of the version before, which read the trailing number
--         as a share), "<id>|<share>" (the version before: a share of the file's batch per
--         tick), "<id>" (older: no share; paces ceil(batch / instances))
-- KEYS[2] {queue:instances}:credit    HASH id -> "<credit ms>:<reported at ms>" (same slot)
-- KEYS[3] {queue:instances}:presence  HASH id -> "<run_id>|<replica name>" (same slot)
-- KEYS[4] {queue:instances}:retired   HASH id -> when retired (ms) (same slot)
-- ARGV[1] instance id (no "|"), ARGV[2] live window (ms), ARGV[3] recent window (ms),
-- ARGV[4] "register" | "leave", ARGV[5] the slice asked for "start:end", ARGV[6] the batch size,
-- ARGV[7] this instance's heartbeat credit (ms), ARGV[8] replica name ("" none),
-- ARGV[9] min replicas, ARGV[10] presence: "" none, "classic" or "shard" (the subscription kind)
-- KEYS[5] {queue:instances}:clock    HASH n (registrations counted), rollbacks (same slot)
-- ARGV[11] the highest n this instance was answered (0: none), ARGV[12] the rollbacks it knows
--          (one more than it was told: a loss it found, which every replica learns as one)
-- Reply: {live, recent, legacy users per tick held back, "start:end,..." slices held back,
--         recorded "start:end", desired "start:end", largest credit, retired (1: this id was
--         retired by a newer instance with its name), presence seen (1/0), members dropped as
--         dead, members dropped as retired, n, rollbacks}
--
-- The clock (docs/state.md): every registration counts one. A count at or below one this
-- instance was already answered means Redis went back in time (came back from a failover
-- behind, or from an old snapshot) or lost the key: the count is set forward and `rollbacks`
-- goes above every count an instance knows, so every replica learns of it at its next
-- registration (within a tick) and writes back what it remembers (spent claims, issued tokens).

local UNIT = 1000000
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live_window, recent_window = tonumber(ARGV[2]), tonumber(ARGV[3])
local id = ARGV[1]
local batch = math.max(0, math.floor(tonumber(ARGV[6]) or 0))
local name = ARGV[8]
local min_replicas = math.max(1, math.floor(tonumber(ARGV[9]) or 1))
local presence_kind = ARGV[10]
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''

local function slice(s)
  local a, b = string.match(s or '', '^(%d+):(%d+)$')
  if not a then return 0, 0 end
  a, b = math.min(tonumber(a), UNIT), math.min(tonumber(b), UNIT)
  return a, math.max(a, b)
end
local function parse(m)
  local mid, a, b = string.match(m, '^(.-)|(%d+):(%d+)|%d+$')
  if mid then
    local s, e = slice(a .. ':' .. b)
    return {id = mid, s = s, e = e}
  end
  local lid, share = string.match(m, '^(.-)|(%d+)$')
  if lid then return {id = lid, legacy = tonumber(share)} end
  return {id = m, unrecorded = true}
end
local function channel(of) return '{queue:instances}:presence:' .. of end
local function subscribers(of)
  local sub = presence_kind == 'shard' and 'SHARDNUMSUB' or 'NUMSUB'
  return tonumber(redis.call('PUBSUB', sub, channel(of))[2])
end
local function drop(m, of)
  redis.call('ZREM', KEYS[1], m)
  redis.call('HDEL', KEYS[2], of)
  redis.call('HDEL', KEYS[3], of)
end

for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - recent_window))) do
  drop(m, parse(m).id)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - recent_window))
local gone = redis.call('HGETALL', KEYS[4])
for i = 1, #gone, 2 do
  if tonumber(gone[i + 1]) < now - recent_window * 2 then redis.call('HDEL', KEYS[4], gone[i]) end
end
local retired_self = redis.call('HEXISTS', KEYS[4], id) == 1

local held_s, held_e = 0, 0
local others = {}
local dead, retired = 0, 0
local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #members, 2 do
  local m, seen = members[i], tonumber(members[i + 1])
  local p = parse(m)
  if p.id == id then
    held_s, held_e = p.s or 0, p.e or 0
    redis.call('ZREM', KEYS[1], m)
  else
    local pres = redis.call('HGET', KEYS[3], p.id)
    local prun, pname = nil, nil
    if pres then prun, pname = string.match(pres, '^(%x*)|(.*)$') end
    if name ~= '' and not retired_self and pname == name then
      drop(m, p.id)
      redis.call('HSET', KEYS[4], p.id, now)
      retired = retired + 1
    elseif seen < now - live_window and prun and prun ~= '' and prun == run
        and presence_kind ~= '' and subscribers(p.id) == 0 then
      drop(m, p.id)
      dead = dead + 1
    else
      p.seen = seen
      table.insert(others, p)
    end
  end
end
redis.call('PEXPIRE', KEYS[4], recent_window * 2)

-- The seat this instance should hold: its rank among the members by id, of at least
-- `min_replicas` equal slices.
local count = #others + 1
local rank = 0
for _, p in ipairs(others) do
  if p.id < id then rank = rank + 1 end
end
local n = math.max(count, min_replicas)
local desired_s = math.floor(UNIT * rank / n)
local desired_e = math.floor(UNIT * (rank + 1) / n)

-- What the others hold: their slices, and at the top of the unit what the members of older
-- versions may pace (a share of the batch, or ceil(batch / instances)).
local taken = {}
local legacy_users = 0
for _, p in ipairs(others) do
  if p.s then
    if p.e > p.s then table.insert(taken, {p.s, p.e}) end
  elseif p.legacy then
    legacy_users = legacy_users + p.legacy
  else
    legacy_users = legacy_users + math.ceil(batch / count)
  end
end
if legacy_users > 0 then
  local from = UNIT
  if batch > 0 then from = math.max(0, UNIT - math.ceil(legacy_users * UNIT / batch)) end
  table.insert(taken, {from, UNIT})
end

-- The largest piece of [a, b) no other member holds, containing [keep_s, keep_e) if that is
-- not empty (it is free: this instance held it).
local function free_piece(a, b, keep_s, keep_e)
  local best_s, best_e = 0, 0
  local cuts = {}
  for _, r in ipairs(taken) do
    if r[2] > a and r[1] < b then table.insert(cuts, r) end
  end
  table.sort(cuts, function(x, y) return x[1] < y[1] end)
  local from = a
  local function consider(s, e)
    if e <= s then return end
    if keep_e > keep_s then
      if s <= keep_s and keep_e <= e then best_s, best_e = s, e end
    elseif e - s > best_e - best_s then
      best_s, best_e = s, e
    end
  end
  for _, r in ipairs(cuts) do
    consider(from, math.min(r[1], b))
    from = math.max(from, r[2])
  end
  consider(from, b)
  return best_s, best_e
end

local asked_s, asked_e = slice(ARGV[5])
local rec_s, rec_e = 0, 0
local leaving = ARGV[4] == 'leave'
if not leaving and not retired_self then
  local keep_s, keep_e = math.max(asked_s, held_s), math.min(asked_e, held_e)
  if keep_e <= keep_s then keep_s, keep_e = 0, 0 end
  rec_s, rec_e = free_piece(asked_s, asked_e, keep_s, keep_e)
  local whole = 0
  if batch > 0 then whole = math.ceil((rec_e - rec_s) * batch / UNIT) end
  redis.call('ZADD', KEYS[1], now, id .. '|' .. rec_s .. ':' .. rec_e .. '|' .. whole)
end
redis.call('PEXPIRE', KEYS[1], recent_window * 2)

local seen_self = 0
if not leaving and not retired_self and presence_kind ~= '' and run ~= ''
    and subscribers(id) > 0 then
  redis.call('HSET', KEYS[3], id, run .. '|' .. name)
  seen_self = 1
elseif not leaving and not retired_self and name ~= '' then
  -- No presence to trust: only the name, to retire this instance when it restarts.
  redis.call('HSET', KEYS[3], id, '|' .. name)
else
  redis.call('HDEL', KEYS[3], id)
end
redis.call('PEXPIRE', KEYS[3], recent_window * 2)

-- Held back: the slices and legacy shares of the members that are recent but not live.
local reserved = {}
local reserved_legacy = 0
for _, p in ipairs(others) do
  if p.seen < now - live_window then
    if p.s then
      if p.e > p.s then table.insert(reserved, p.s .. ':' .. p.e) end
    elseif p.legacy then
      reserved_legacy = reserved_legacy + p.legacy
    else
      reserved_legacy = reserved_legacy + math.ceil(batch / count)
    end
  end
end

local credit = math.max(0, math.floor(tonumber(ARGV[7]) or 0))
if credit > 0 and not leaving then
  redis.call('HSET', KEYS[2], id, credit .. ':' .. now)
else
  redis.call('HDEL', KEYS[2], id)
end
local largest = 0
local entries = redis.call('HGETALL', KEYS[2])
for i = 1, #entries, 2 do
  local c, at = string.match(entries[i + 1], '^(%d+):(%d+)$')
  if c and tonumber(at) >= now - live_window then
    largest = math.max(largest, tonumber(c))
  else
    redis.call('HDEL', KEYS[2], entries[i])
  end
end
redis.call('PEXPIRE', KEYS[2], recent_window * 2)

local retired_flag = 0
if retired_self then retired_flag = 1 end
local clock_n, rollbacks = 0, 0
if KEYS[5] then
  local seen_n, known_rollbacks = tonumber(ARGV[11]) or 0, tonumber(ARGV[12]) or 0
  clock_n = redis.call('HINCRBY', KEYS[5], 'n', 1)
  rollbacks = tonumber(redis.call('HGET', KEYS[5], 'rollbacks') or '0')
  if clock_n <= seen_n then
    clock_n = seen_n + 1
    rollbacks = math.max(rollbacks, known_rollbacks) + 1
    redis.call('HSET', KEYS[5], 'n', clock_n, 'rollbacks', rollbacks)
  elseif known_rollbacks > rollbacks then
    -- A replica reports more rollbacks than the roster holds: one it found itself (a sale's
    -- state behind what it saw), or a count this key lost.
    rollbacks = known_rollbacks
    redis.call('HSET', KEYS[5], 'rollbacks', rollbacks)
  end
end
return {redis.call('ZCOUNT', KEYS[1], now - live_window, '+inf'), redis.call('ZCARD', KEYS[1]),
        reserved_legacy, table.concat(reserved, ','), rec_s .. ':' .. rec_e,
        desired_s .. ':' .. desired_e, largest, retired_flag, seen_self, dead, retired,
        clock_n, rollbacks}
