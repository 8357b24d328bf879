#!lua flags=allow-oom
-- poll.lua: a waiting user's poll (SPEC §4 Poll). Records the heartbeat; when the user's fixed seq
-- is within admitted_count, stores the caller's candidate token (unless one is stored already),
-- takes the user out of the waiting and heartbeat sets and records the wait. Atomic so that two
-- concurrent polls of one user end with one stored token, answered to both.
--
-- KEYS[1..7] as in enter.lua (waiting, heartbeat, seq, admitted_count, seqtime, waits, advances)
-- KEYS[8]    queue:{T}:token:{userId}  STRING "expiresAt|token"
-- ARGV[1] userId, ARGV[2] now (ms), ARGV[3] candidate "expiresAt|token", ARGV[4] token TTL (s),
-- ARGV[5] key TTL (ms), ARGV[6] how many wait samples to keep
-- Reply: {"ADMITTED", "expiresAt|token"[, waited ms when this poll issued it]}
--      | {"WAITING", seq, rank} | {"NONE"}
--
-- `allow-oom`: under maxmemory this script still runs (Redis refuses plain writes then). It only
-- refreshes or removes state of users already admitted to the waiting room, so a full Redis keeps
-- the queue moving instead of failing it open; new enters (enter.lua, no allow-oom) are refused.

local user, now, candidate, token_ttl, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local stored = redis.call('GET', KEYS[8])
if stored then
  return {'ADMITTED', stored}
end

local seq = redis.call('ZSCORE', KEYS[1], user)
if not seq then
  return {'NONE'}
end

local function touch()
  for i = 1, 7 do
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end

local admitted = tonumber(redis.call('GET', KEYS[4]) or '0')
if tonumber(seq) <= admitted then
  redis.call('SET', KEYS[8], candidate, 'EX', token_ttl)
  redis.call('ZREM', KEYS[1], user)
  redis.call('ZREM', KEYS[2], user)
  -- The user entered at or after the nearest checkpoint at or below its seq (at most 1 s or 16
  -- seqs earlier), so the wait is over-estimated by less than a second.
  local cp = redis.call('ZREVRANGEBYSCORE', KEYS[5], seq, '-inf', 'LIMIT', 0, 1)[1]
  touch()
  if cp then
    local entered = tonumber(string.match(cp, ':(%d+)$'))
    local waited = math.max(0, tonumber(now) - entered)
    redis.call('LPUSH', KEYS[6], waited)
    redis.call('LTRIM', KEYS[6], 0, tonumber(ARGV[6]) - 1)
    return {'ADMITTED', candidate, waited}
  end
  return {'ADMITTED', candidate}
end

redis.call('ZADD', KEYS[2], now, user)
touch()
return {'WAITING', seq, redis.call('ZRANK', KEYS[1], user)}
