#!lua flags=allow-oom
-- sweep.lua: evict waiting users with no heartbeat since the cutoff (docs/api.md#eviction), at most
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
-- A sale that is missing (lost with Redis' data) evicts nobody: its timeout is unknown. Each
-- sweep also creates the window after the next one and records it in the sale (aheadWindow,
-- "width:index");
-- finding that window missing while it is still ahead means the bitmaps were deleted or lost,
-- so silence in them proves nothing: the windows restart (windowSince = now, nobody is evicted
-- for a timeout) and the loss is counted in queue:{T}:losses as `alive` (kept 30 min, as the
-- target's keys).
-- The queued bitmap found missing while users wait (deleted, or lost with Redis' data) is made
-- again from the waiting set, and the loss counted as `queued`: without it nobody silent would
-- ever be evicted, and a place lost with the waiting set could not be taken back (rejoin.lua).
-- Reply: number of users evicted
--
-- `allow-oom`: under maxmemory this script still runs (Redis refuses plain writes then). It only
-- refreshes or removes state of users already admitted to the waiting room, so a full Redis keeps
-- the queue moving instead of failing it open; new enters (enter.lua, no allow-oom) are refused.

local max, now, credit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local sale = redis.call('HMGET', KEYS[4], 'heartbeatTimeoutS', 'windowMs', 'windowSince',
  'aheadWindow')
if not sale[1] then
  max = 0
end
local timeout_ms = tonumber(sale[1] or ARGV[4]) * 1000
local window_ms = tonumber(sale[2]) or math.max(1, math.floor(timeout_ms / 4))
local since = tonumber(sale[3] or '0')
local window_ttl = string.format('%d', 14 * window_ms)
local cutoff = now - timeout_ms - credit
local first, last = math.floor(cutoff / window_ms), math.floor(now / window_ms) + 1
if last - first >= 12 or cutoff < since then
  first, max = last - 11, 0
end
local prefix_of_target = string.match(KEYS[1], '^(.*)waiting$')
local prefix = prefix_of_target .. string.format('alive:%d:', window_ms)
local windows = {}
for w = first, last do
  local key = prefix .. string.format('%d', w)
  redis.call('PEXPIRE', key, window_ttl, 'NX')
  windows[#windows + 1] = key
end
-- The window the last sweep created furthest ahead (aheadWindow, two past its current one):
-- while it is still in the future no poll has written it, so its absence means the windows
-- were deleted or lost, not that nobody polled.
local ahead_width, ahead = string.match(sale[4] or '', '^(%d+):(%d+)$')
ahead = tonumber(ahead)
if ahead and tonumber(ahead_width) == window_ms and ahead > last - 1 and ahead <= last + 1
  and sale[1] and cutoff >= since
  and redis.call('EXISTS', prefix .. string.format('%d', ahead)) == 0 then
  redis.call('HSET', KEYS[4], 'windowSince', string.format('%d', now))
  local losses = prefix_of_target .. 'losses'
  redis.call('HINCRBY', losses, 'alive', 1)
  redis.call('PEXPIRE', losses, 1800000)
  max = 0
end
redis.call('SET', windows[#windows - 1], '', 'PX', window_ttl, 'NX')
redis.call('SET', windows[#windows], '', 'PX', window_ttl, 'NX')
redis.call('SET', prefix .. string.format('%d', last + 1), '', 'PX', window_ttl, 'NX')
if sale[1] then
  redis.call('HSET', KEYS[4], 'aheadWindow', string.format('%d:%d', window_ms, last + 1))
end

local queued_bytes = redis.call('STRLEN', KEYS[2])
if queued_bytes == 0 and redis.call('EXISTS', KEYS[1]) == 1 then
  local at = 0
  while true do
    local chunk = redis.call('ZRANGE', KEYS[1], at, at + 999, 'WITHSCORES')
    if #chunk == 0 then
      break
    end
    local bits = {}
    for i = 2, #chunk, 2 do
      bits[#bits + 1], bits[#bits + 2], bits[#bits + 3], bits[#bits + 4] = 'SET', 'u1', chunk[i], '1'
    end
    redis.call('BITFIELD', KEYS[2], unpack(bits))
    at = at + 1000
  end
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
  local losses = prefix_of_target .. 'losses'
  redis.call('HINCRBY', losses, 'queued', 1)
  redis.call('PEXPIRE', losses, 1800000)
  queued_bytes = redis.call('STRLEN', KEYS[2])
end
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
