#!lua flags=allow-oom
-- instances.lua: the instance registry. Every gateway's pump records itself here each tick; the
-- answer, the number of instances seen within the window, is the replica count the fail-open
-- pacer divides the admission budget by. Timed by Redis' own clock so instances agree.
--
-- KEYS[1] queue:instances  ZSET instance id -> last seen (ms); a key of its own (own slot)
-- ARGV[1] instance id, ARGV[2] window (ms)
-- Reply: live instances (this one included)

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('PEXPIRE', KEYS[1], window * 2)
return redis.call('ZCARD', KEYS[1])
