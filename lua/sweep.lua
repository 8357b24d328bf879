#!lua flags=allow-oom
-- sweep.lua: evict waiting users with no heartbeat since the cutoff (SPEC §4 Eviction), at most
-- `max` per call, lowest seq first. Heartbeats are bits by seq in one bitmap per window
-- (src/store/liveness.rs): the stale are the queued seqs with no bit in any window from the one
-- holding the cutoff to the next one, found with BITOP over a few kilobytes and BITPOS, then
-- mapped to their user through the waiting set: O(bitmap bytes + k log N). Atomic, so a user who
-- polls concurrently is either evicted whole or kept whole.
--
-- It also gives each window's bitmap its lifetime: PEXPIRE NX on every window read (a poll
-- that created one with SETBIT set none), and the current and next windows are created ahead,
-- empty, with their lifetime, so polls find them in place.
--
-- KEYS[1] queue:{T}:waiting   ZSET userId -> seq
-- KEYS[2] queue:{T}:queued    bitmap by seq: 1 while that seq waits
-- KEYS[3] queue:{T}:sweep     scratch bitmap, deleted before returning
-- KEYS[4] queue:{T}:sale      HASH: heartbeatTimeoutS, windowMs, windowSince (sale_write.lua)
-- ARGV[1] max evictions, ARGV[2] now (ms), ARGV[3] credit (ms): time in which some replica could
-- not take its users' heartbeats (an outage, shedding), not held against them; ARGV[4] the
-- caller's default heartbeat timeout (s), for a sale that does not exist (lost with Redis' data)
-- The windows read are queue:{T}:alive:{windowMs}:{i}, named here from the sale's width (same
-- hash tag, same slot): from the window holding the cutoff (now - timeout - credit) to the one
-- after now's (a replica whose clock runs a little ahead). Nobody is evicted when that is more
-- than 12 windows (a long credit), nor while the cutoff lies before windowSince (the width
-- changed less than a timeout ago: the heartbeats before the change are in windows of the old
-- width, which are not read); the last 12 windows are then read only to give their bitmaps
-- their lifetime.
-- A sale that is missing (lost with Redis' data) evicts nobody: its timeout is unknown. A
-- window inside the range read that does not exist although the sweep creates each one ahead of
-- time is lost (or never observed: no sweep ran then), so silence in it proves nothing. When
-- no window before the current one survives in the range while users wait (the bitmaps were
-- deleted, or Redis lost them), the windows restart (windowSince = now, nobody is evicted for a
-- timeout) and the loss is counted in queue:{T}:losses as `alive` (kept as long as the target's
-- keys, 30 min).
-- Reply: number of users evicted
--
-- `allow-oom`: under maxmemory this script still runs (Redis refuses plain writes then). It only
-- refreshes or removes state of users already admitted to the waiting room, so a full Redis keeps
-- the queue moving instead of failing it open; new enters (enter.lua, no allow-oom) are refused.

local max, now, credit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local sale = redis.call('HMGET', KEYS[4], 'heartbeatTimeoutS', 'windowMs', 'windowSince')
if not sale[1] then
  max = 0
end
local timeout_ms = tonumber(sale[1] or ARGV[4]) * 1000
local window_ms = tonumber(sale[2]) or math.max(1, math.floor(timeout_ms / 4))
local since = tonumber(sale[3] or '0')
local window_ttl = string.format('%d', 14 * window_ms)
local cutoff = now - timeout_ms - credit
local first, last = math.floor(cutoff / window_ms), math.floor(now / window_ms) + 1
-- Whether silence in the windows read means anything: not while the width is new.
local observed = cutoff >= since and sale[1]
if last - first >= 12 or cutoff < since then
  first, max = last - 11, 0
end
local prefix_of_target = string.match(KEYS[1], '^(.*)waiting$')
local prefix = prefix_of_target .. string.format('alive:%d:', window_ms)
local windows, past = {}, 0
for w = first, last do
  local key = prefix .. string.format('%d', w)
  redis.call('PEXPIRE', key, window_ttl, 'NX')
  if w < last - 1 and redis.call('EXISTS', key) == 1 then
    past = past + 1
  end
  windows[#windows + 1] = key
end
-- Only users who entered before the current window make silence in the past ones meaningful
-- (the oldest enter-time checkpoint, queue:{T}:seqtime "seq:ms", says when they came).
local function entered_before(ms)
  local oldest = redis.call('ZRANGE', prefix_of_target .. 'seqtime', 0, 0)[1]
  return oldest and tonumber(string.match(oldest, ':(%d+)$')) < ms
end
if past == 0 and observed and redis.call('STRLEN', KEYS[2]) > 0
  and entered_before((last - 1) * window_ms) then
  redis.call('HSET', KEYS[4], 'windowSince', string.format('%d', now))
  local losses = prefix_of_target .. 'losses'
  redis.call('HINCRBY', losses, 'alive', 1)
  redis.call('PEXPIRE', losses, 1800000)
  max = 0
end
redis.call('SET', windows[#windows - 1], '', 'PX', window_ttl, 'NX')
redis.call('SET', windows[#windows], '', 'PX', window_ttl, 'NX')

local queued_bytes = redis.call('STRLEN', KEYS[2])
if queued_bytes == 0 or max <= 0 then
  return 0
end

-- stale = queued AND NOT (alive in any window). The OR is padded to the queued bitmap's length
-- first, so that NOT covers every queued seq.
redis.call('BITOP', 'OR', KEYS[3], unpack(windows))
local last_bit = queued_bytes * 8 - 1
redis.call('SETBIT', KEYS[3], last_bit, redis.call('GETBIT', KEYS[3], last_bit))
redis.call('BITOP', 'NOT', KEYS[3], KEYS[3])
redis.call('BITOP', 'AND', KEYS[3], KEYS[3], KEYS[2])

local evicted, from = 0, 0
while evicted < max do
  local seq = redis.call('BITPOS', KEYS[3], 1, from)
  if seq < 0 then
    break
  end
  redis.call('SETBIT', KEYS[3], seq, 0)
  redis.call('SETBIT', KEYS[2], seq, 0)
  local user = redis.call('ZRANGEBYSCORE', KEYS[1], seq, seq, 'LIMIT', 0, 1)[1]
  if user then
    redis.call('ZREM', KEYS[1], user)
    evicted = evicted + 1
  end
  from = math.floor(seq / 8)
end
redis.call('DEL', KEYS[3])
return evicted
