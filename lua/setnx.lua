#!lua flags=allow-oom
-- setnx.lua: `SET key value NX PX ttl` for the pump lock. A script only for its `allow-oom`
-- flag: under maxmemory Redis refuses a plain SET, and then the pump could not lock (no
-- admissions). The key is tiny.
--
-- KEYS[1] queue:{T}:lock
-- ARGV[1] value (the lock's owner), ARGV[2] TTL (ms)
-- Reply: 1 when this call set it, or the key already holds this very value (a retried call whose
-- first attempt reached Redis but whose reply was lost or late), 0 when the key holds another
-- value

if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return 1
end
return 0
