#!lua flags=allow-oom
-- sweep.lua: evict waiting users whose last heartbeat is older than the cutoff (SPEC §4
-- Eviction), at most `max` per call, oldest first: O(log N + k). Atomic so that a user who polls
-- concurrently is either evicted whole or kept whole, never left half-removed.
--
-- KEYS[1] queue:{T}:waiting, KEYS[2] queue:{T}:heartbeat
-- ARGV[1] cutoff (ms, heartbeats at or before it are stale), ARGV[2] max evictions
-- Reply: number of users evicted
--
-- `allow-oom`: under maxmemory this script still runs (Redis refuses plain writes then). It only
-- refreshes or removes state of users already admitted to the waiting room, so a full Redis keeps
-- the queue moving instead of failing it open; new enters (enter.lua, no allow-oom) are refused.

local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, user in ipairs(stale) do
  redis.call('ZREM', KEYS[1], user)
  redis.call('ZREM', KEYS[2], user)
end
return #stale
