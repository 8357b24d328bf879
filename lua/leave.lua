#!lua flags=allow-oom
-- leave.lua: explicit leave (docs/api.md#leave). Removes the user from the waiting room and drops
-- an unused token marker, in one step so that a concurrent poll cannot re-admit a user who left.
--
-- KEYS[1] queue:{T}:waiting, KEYS[2] queue:{T}:queued, KEYS[3] queue:{T}:token:{userId}
-- ARGV[1] userId
-- Reply: number of structures the user was removed from (0 when not present: leave is idempotent)
--
-- `allow-oom`: under maxmemory this script still runs (Redis refuses plain writes then). It only
-- refreshes or removes state of users already admitted to the waiting room, so a full Redis keeps
-- the queue moving instead of failing it open; new enters (enter.lua, no allow-oom) are refused.

local user = ARGV[1]
local removed = 0
local seq = redis.call('ZSCORE', KEYS[1], user)
if seq then
  removed = redis.call('ZREM', KEYS[1], user)
  redis.call('SETBIT', KEYS[2], seq, 0)
end
return removed + redis.call('DEL', KEYS[3])
