#!lua flags=allow-oom
-- instances.lua: the instance registry. Every gateway's pump records itself here each tick and
-- removes itself on a clean shutdown. The answers: instances seen within the live window (the
-- replica count the fail-open pacer divides the admission budget by) and within the longer
-- recent window (an instance recent but not live stopped without a clean shutdown: it may be cut
-- off from Redis and pacing its share, so the pump admits that much less). Timed by Redis' own
-- clock so instances agree.
--
-- KEYS[1] queue:instances  ZSET instance id -> last seen (ms); a key of its own (own slot)
-- ARGV[1] instance id, ARGV[2] live window (ms), ARGV[3] recent window (ms),
-- ARGV[4] "register" | "leave"
-- Reply: {live instances, recent instances} (this one included when registering)

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live_window, recent_window = tonumber(ARGV[2]), tonumber(ARGV[3])
if ARGV[4] == 'leave' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now, ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - recent_window)
redis.call('PEXPIRE', KEYS[1], recent_window * 2)
return {redis.call('ZCOUNT', KEYS[1], now - live_window, '+inf'), redis.call('ZCARD', KEYS[1])}
