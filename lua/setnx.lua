#!lua flags=allow-oom
-- setnx.lua: `SET key value NX PX ttl` for the pump lock and the single-use claims. A script only
-- for its `allow-oom` flag: under maxmemory Redis refuses a plain SET, and then the pump could not
-- lock (no admissions) and the gate could not record a claim (tokens reusable). Both keys are
-- tiny and bounded by the admission budget.
--
-- KEYS[1] queue:{T}:lock or queue:{T}:used:{tokenId}
-- ARGV[1] value (the lock's owner, or the claiming request's own id), ARGV[2] TTL (ms)
-- Reply: 1 when this call set it, or the key already holds this very value (a retried call whose
-- first attempt reached Redis but whose reply was lost or late: the caller's own claim, not a
-- second use), 0 when the key holds another value

if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return 1
end
return 0
