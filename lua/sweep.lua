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
-- KEYS[4..] queue:{T}:alive:{window}, oldest first; the last two are the current and next window
-- ARGV[1] max evictions, ARGV[2] TTL of a window's bitmap (ms)
-- Reply: number of users evicted
--
-- `allow-oom`: under maxmemory this script still runs (Redis refuses plain writes then). It only
-- refreshes or removes state of users already admitted to the waiting room, so a full Redis keeps
-- the queue moving instead of failing it open; new enters (enter.lua, no allow-oom) are refused.

local max, window_ttl = tonumber(ARGV[1]), ARGV[2]

local windows = {}
for i = 4, #KEYS do
  redis.call('PEXPIRE', KEYS[i], window_ttl, 'NX')
  windows[#windows + 1] = KEYS[i]
end
redis.call('SET', KEYS[#KEYS - 1], '', 'PX', window_ttl, 'NX')
redis.call('SET', KEYS[#KEYS], '', 'PX', window_ttl, 'NX')

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
