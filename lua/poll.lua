#!lua flags=allow-oom
-- poll.lua: a waiting user's poll (SPEC §4 Poll): the heartbeat and the admission check, four
-- commands at most. It signs nothing and stores no token: when the user's fixed seq is within
-- admitted_count it answers DUE, and the caller signs a token and stores it with issue.lua (once
-- per user). It does not extend the target's key TTL: enter, every admission step (advance.lua)
-- and issue.lua do, so a target with waiting users keeps its keys while its pump runs.
--
-- KEYS[1..9] as in enter.lua (waiting, queued, seq, admitted_count, seqtime, waits, advances,
--            token:{userId}, alive:{window})
-- ARGV[1] userId
-- Reply: {"WAITING", seq, rank} | {"DUE"} | {"ADMITTED", "expiresAt|token"} | {"NONE"}
--
-- `allow-oom`: under maxmemory this script still runs (Redis refuses plain writes then). It only
-- refreshes state of users already in the waiting room, so a full Redis keeps the queue moving
-- instead of failing it open; new enters (enter.lua, no allow-oom) are refused.

local user = ARGV[1]

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

-- The heartbeat: one bit. The window's bitmap gets its lifetime from enter.lua or the sweep
-- (which also creates the next window's ahead of time), so a poll only sets the bit.
redis.call('SETBIT', KEYS[9], seq, 1)
return {'WAITING', seq, redis.call('ZRANK', KEYS[1], user)}
