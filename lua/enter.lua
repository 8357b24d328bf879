#!lua
-- enter.lua: join a target's waiting room (SPEC §4 Enter). Atomic so that concurrent duplicate
-- enters of one user get one seq and waste none, and the capacity check cannot race the INCR.
--
-- KEYS[1] queue:{T}:waiting         ZSET userId -> seq
-- KEYS[2] queue:{T}:queued          bitmap by seq: 1 while that seq waits (for the sweep)
-- KEYS[3] queue:{T}:seq             STRING, INCR
-- KEYS[4] queue:{T}:admitted_count  STRING
-- KEYS[5] queue:{T}:seqtime         ZSET "seq:ms" -> seq: sparse enter-time checkpoints, for wait
--                                    statistics (a new one after 16 seqs or 1 s; ~6 bytes a user
--                                    instead of a timestamp per user)
-- KEYS[6] queue:{T}:waits           LIST of admission waits (ms)
-- KEYS[7] queue:{T}:advances        LIST of "ms:admitted_count" samples
-- KEYS[8] queue:{T}:token:{userId}  STRING "expiresAt|token"
-- KEYS[9] queue:{T}:alive:{window}  bitmap by seq: heartbeats of the current window (the window
--                                    is the caller's: now / (heartbeat timeout / 4))
-- ARGV[1] userId, ARGV[2] now (ms), ARGV[3] capacity, ARGV[4] key TTL (ms),
-- ARGV[5] TTL of a window's bitmap (ms)
-- Reply: {"ADMITTED", "expiresAt|token"} | {"WAITING", seq, rank, opened} | {"FULL"}
--   opened: 1 when this enter put the first user into an empty waiting room (the caller then
--   makes sure the target is on `queue:active`: the pump may have retired it as empty)
--
-- Key lifetimes: every key this script may create gets the TTL in the same call (a fresh
-- sequence, an empty waiting room, a new checkpoint), and the TTL of all seven is extended with
-- every checkpoint (at most once per 16 enters or per second) and by every admission step
-- (advance.lua), not on every enter: seven PEXPIREs were half of an enter's commands.
--
-- The `#!lua` shebang (no allow-oom flag) makes Redis refuse the whole script under maxmemory
-- before it runs, instead of failing at its first write and keeping the writes before it.

local user, now, capacity, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

local stored = redis.call('GET', KEYS[8])
if stored then
  return {'ADMITTED', stored}
end

local function touch()
  for i = 1, 7 do
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end

-- The heartbeat: the seq's bit in this window's bitmap, which expires on its own (NX: the
-- first writer of a window sets its lifetime; polls only set bits).
local function heartbeat(s)
  redis.call('SETBIT', KEYS[9], s, 1)
  redis.call('PEXPIRE', KEYS[9], ARGV[5], 'NX')
end

local seq = redis.call('ZSCORE', KEYS[1], user)
if seq then
  heartbeat(tonumber(seq))
  return {'WAITING', seq, redis.call('ZRANK', KEYS[1], user), 0}
end

local waiting = redis.call('ZCARD', KEYS[1])
if waiting >= capacity then
  return {'FULL'}
end

local s = redis.call('INCR', KEYS[3])
if s == 1 then
  -- A fresh sequence must start from a fresh mark: a stale admitted_count left behind by an
  -- expired seq would admit newcomers at once (and stale queued bits would name new users).
  redis.call('DEL', KEYS[2], KEYS[4], KEYS[7])
end
redis.call('ZADD', KEYS[1], s, user)
redis.call('SETBIT', KEYS[2], s, 1)
heartbeat(s)
local last = redis.call('ZREVRANGE', KEYS[5], 0, 0)[1]
local last_seq, last_ms = 0, 0
if last then
  last_seq, last_ms = string.match(last, '^(%d+):(%d+)$')
  last_seq, last_ms = tonumber(last_seq), tonumber(last_ms)
end
local checkpoint = not last or s - last_seq >= 16 or tonumber(now) - last_ms >= 1000
if checkpoint then
  redis.call('ZADD', KEYS[5], s, string.format('%d:%d', s, tonumber(now)))
end
if checkpoint or s == 1 or waiting == 0 then
  touch()
end
return {'WAITING', tostring(s), waiting, waiting == 0 and 1 or 0}
