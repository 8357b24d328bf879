#!lua flags=allow-oom
-- issue.lua: stores the entry token of a user the pump admitted (after poll.lua answered DUE).
-- Atomic and idempotent, so two concurrent polls of one user end with one stored token, answered
-- to both: a token stored already wins over the caller's candidate. Takes the user out of the
-- waiting set and the queued bitmap, records the wait, and refreshes the target's key TTL.
--
-- KEYS[1..7] the target's shared keys (as enter.lua), KEYS[8] queue:{T}:token:{userId},
-- KEYS[9] queue:{T}:sale (its windowMs names the heartbeat bitmap, as in poll.lua),
-- KEYS[10] queue:{T}:losses (its holdUntil: advance.lua found the sale's state behind what a
-- replica saw, and every replica is writing back the tokens it signed: none is signed anew
-- before that time, docs/state.md)
-- ARGV[1] userId, ARGV[2] now (ms), ARGV[3] candidate "expiresAt|token", ARGV[4] token TTL (s),
-- ARGV[5] key TTL (ms), ARGV[6] how many wait samples to keep, ARGV[7] the caller's default
-- window width (ms), for a sale that does not exist
-- Reply: {"ADMITTED", "expiresAt|token"[, waited ms when this call issued it]}
--      | {"WAITING", seq, rank} | {"HELD", seq} (admitted; no token before holdUntil) | {"NONE"}
--
-- `allow-oom`: see poll.lua (only users already in the waiting room are touched).

local user, now, candidate, token_ttl, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local stored = redis.call('GET', KEYS[8])
if stored then
  return {'ADMITTED', stored}
end

local seq = redis.call('ZSCORE', KEYS[1], user)
if not seq then
  return {'NONE'}
end
if tonumber(seq) > tonumber(redis.call('GET', KEYS[4]) or '0') then
  -- Not admitted (the mark never moves back; kept for a caller that did not poll first).
  local window_ms = tonumber(redis.call('HGET', KEYS[9], 'windowMs') or ARGV[7])
  local window_key = string.match(KEYS[1], '^(.*)waiting$') ..
    string.format('alive:%d:%d', window_ms, math.floor(tonumber(now) / window_ms))
  redis.call('SETBIT', window_key, seq, 1)
  return {'WAITING', seq, redis.call('ZRANK', KEYS[1], user)}
end

if KEYS[10] and tonumber(redis.call('HGET', KEYS[10], 'holdUntil') or '0') > tonumber(now) then
  return {'HELD', seq}
end

redis.call('SET', KEYS[8], candidate, 'EX', token_ttl)
redis.call('ZREM', KEYS[1], user)
redis.call('SETBIT', KEYS[2], seq, 0)
-- The user entered at or after the nearest checkpoint at or below its seq (at most 1 s or 16
-- seqs earlier), so the wait is over-estimated by less than a second.
local cp = redis.call('ZREVRANGEBYSCORE', KEYS[5], seq, '-inf', 'LIMIT', 0, 1)[1]
local waited
if cp then
  local entered = tonumber(string.match(cp, ':(%d+)$'))
  waited = math.max(0, tonumber(now) - entered)
  redis.call('LPUSH', KEYS[6], waited)
  redis.call('LTRIM', KEYS[6], 0, tonumber(ARGV[6]) - 1)
end
-- After the LPUSH, which may have created the list of waits: every key gets the TTL.
for i = 1, 7 do
  redis.call('PEXPIRE', KEYS[i], ttl)
end
if waited then
  return {'ADMITTED', candidate, waited}
end
return {'ADMITTED', candidate}
