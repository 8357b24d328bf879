#!lua
-- ticks.lua: a sale's recent history for the operator console (`GET /sales/{type}/{id}/ticks`):
-- one entry per pump visit that ran an admission step, newest first; the last ARGV[2] only, and
-- the key expires ARGV[3] ms after the last visit, so an idle sale's history goes by itself.
--
-- Without allow-oom: under maxmemory the history is refused (the pump goes on without it) and
-- never takes memory the queue needs.
--
-- KEYS[1] queue:{T}:ticks  LIST "at:admitted:evicted:waiting:batch:outcome"
-- ARGV[1] the entry, ARGV[2] entries to keep (≥ 1), ARGV[3] TTL (ms)
-- Reply: the entries kept

redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, math.max(1, tonumber(ARGV[2]) or 1) - 1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return redis.call('LLEN', KEYS[1])
