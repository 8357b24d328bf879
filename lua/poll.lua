#!lua flags=allow-oom
-- poll.lua: a waiting user's poll (SPEC §4 Poll): the heartbeat and the admission check, four
-- commands at most. It signs nothing and stores no token: when the user's fixed seq is within
-- admitted_count it answers DUE, and the caller signs a token and stores it with issue.lua (once
-- per user). It does not extend the target's key TTL: enter, every admission step (advance.lua)
-- and issue.lua do, so a target with waiting users keeps its keys while its pump runs.
--
-- KEYS[1..7] as in enter.lua (waiting, heartbeat, seq, admitted_count, seqtime, waits, advances)
-- KEYS[8]    queue:{T}:token:{userId}  STRING "expiresAt|token"
-- ARGV[1] userId, ARGV[2] now (ms)
-- Reply: {"WAITING", seq, rank} | {"DUE"} | {"ADMITTED", "expiresAt|token"} | {"NONE"}
--
-- `allow-oom`: under maxmemory this script still runs (Redis refuses plain writes then). It only
-- refreshes state of users already in the waiting room, so a full Redis keeps the queue moving
-- instead of failing it open; new enters (enter.lua, no allow-oom) are refused.

local user, now = ARGV[1], ARGV[2]

local seq = redis.call('ZSCORE', KEYS[1], user)
if not seq then
  -- Not waiting: admitted already (the stored token, answered again), or never entered.
  local stored = redis.call('GET', KEYS[8])
  if stored then
    return {'ADMITTED', stored}
  end
  return {'NONE'}
end

if tonumber(seq) <= tonumber(redis.call('GET', KEYS[4]) or '0') then
  return {'DUE'}
end

redis.call('ZADD', KEYS[2], now, user)
return {'WAITING', seq, redis.call('ZRANK', KEYS[1], user)}
