#!lua flags=allow-oom
-- advance.lua: one admission step of a target (SPEC §5). Moves admitted_count so that exactly the
-- next `batch` live waiting users above the mark are admitted (users who left or were evicted take
-- no slot); with fewer waiting, up to the current seq. Never backwards, never beyond seq.
--
-- The cluster-wide bound lives here, not in the lock: the script refuses a second advance of the
-- same target within `min_interval` ms of the last one, timed by Redis' own clock (TIME), so a
-- paused lock holder, a lost reply, a retried call or a second instance cannot double-advance.
--
-- KEYS[1..7] as in enter.lua (waiting, queued, seq, admitted_count, seqtime, waits, advances)
-- KEYS[8]    queue:{T}:last_advance  STRING, Redis time (ms) of the last advance
-- ARGV[1] batch size, ARGV[2] min interval (ms), ARGV[3] key TTL (ms), ARGV[4] samples to keep
-- Reply: {outcome, admitted_count, newly admitted live users, waiting count[, ms until allowed]}
--   outcome: "ADVANCED" | "GUARDED" (too soon after the last advance; the 5th element says how
--   long until the next advance is allowed) | "IDLE" (nobody to admit)
--
-- `allow-oom`: under maxmemory this script still runs (Redis refuses plain writes then). It only
-- refreshes or removes state of users already admitted to the waiting room, so a full Redis keeps
-- the queue moving instead of failing it open; new enters (enter.lua, no allow-oom) are refused.

local batch, min_interval, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local mark = tonumber(redis.call('GET', KEYS[4]) or '0')
local waiting = redis.call('ZCARD', KEYS[1])

local last = tonumber(redis.call('GET', KEYS[8]) or '0')
if now - last < min_interval then
  return {'GUARDED', mark, 0, waiting, min_interval - (now - last)}
end

local seq = tonumber(redis.call('GET', KEYS[3]) or '0')
local above = string.format('(%d', mark)
local live_above = redis.call('ZCOUNT', KEYS[1], above, '+inf')
if live_above == 0 or mark >= seq then
  return {'IDLE', mark, 0, waiting}
end

local new_mark = seq
local admitted = live_above
if live_above > batch then
  local nth = redis.call('ZRANGEBYSCORE', KEYS[1], above, '+inf', 'WITHSCORES', 'LIMIT', batch - 1, 1)
  new_mark = tonumber(nth[2])
  admitted = batch
end

redis.call('SET', KEYS[4], string.format('%d', new_mark))
-- Enter-time checkpoints below the one covering the lowest waiting seq are no longer needed.
local lowest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
if lowest then
  local cover = redis.call('ZREVRANGEBYSCORE', KEYS[5], lowest, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)[2]
  if cover then
    redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', '(' .. cover)
  end
end
redis.call('SET', KEYS[8], string.format('%d', now), 'PX', ttl)
redis.call('LPUSH', KEYS[7], string.format('%d:%d', now, new_mark))
redis.call('LTRIM', KEYS[7], 0, tonumber(ARGV[4]) - 1)
for i = 1, 7 do
  redis.call('PEXPIRE', KEYS[i], ttl)
end
return {'ADVANCED', new_mark, admitted, waiting}
