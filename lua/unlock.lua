#!lua flags=allow-oom
-- unlock.lua: release the pump lock of a target only if this instance still owns it, so a holder
-- whose lock already expired cannot delete the lock another instance has taken since.
--
-- KEYS[1] queue:{T}:lock
-- ARGV[1] instance id
-- Reply: 1 when released, 0 when the lock was not ours (or gone)
--
-- `allow-oom`: under maxmemory this script still runs (Redis refuses plain writes then). It only
-- refreshes or removes state of users already admitted to the waiting room, so a full Redis keeps
-- the queue moving instead of failing it open; new enters (enter.lua, no allow-oom) are refused.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
