#!lua flags=allow-oom
-- rejoin.lua: puts a user back at the place its signed queue ticket proves, when poll.lua found
-- it neither waiting nor holding a token (docs/state.md): the waiting set was lost (deleted,
-- or Redis came back from a failover behind the enters). Atomic, so the place is checked and
-- taken in one step.
--
-- The place still stands only if nothing took it away: its bit in the queued bitmap is set
-- (leave, eviction and issue.lua clear it; a lost waiting set leaves it, and a repaired
-- sequence sets the bits of the seqs Redis lost), or it is above the sequence counter, which
-- proves the counter went back (it is set forward, the seqs between marked as standing, and the
-- heartbeat windows restarted). A
-- seq another user holds is never given twice. A place at or below the mark was admitted and
-- not yet issued: the user is put back and answered DUE, and the caller issues its token as
-- for any admitted user.
--
-- KEYS[1] queue:{T}:waiting, KEYS[2] queue:{T}:queued, KEYS[3] queue:{T}:seq,
-- KEYS[4] queue:{T}:admitted_count, KEYS[5] queue:{T}:token:{userId}, KEYS[6] queue:{T}:sale,
-- KEYS[7] queue:{T}:deleted (an operator deleted the sale lately: no place of it stands)
-- ARGV[1] userId, ARGV[2] the ticket's seq, ARGV[3] now (ms), ARGV[4] the caller's default
-- window width (ms, a sale that does not exist), ARGV[5] key TTL (ms)
-- Reply: {"ADMITTED", "expiresAt|token"} | {"WAITING", seq, rank} | {"DUE"} | {"NONE"}
-- Each place given back is counted in queue:{T}:losses as `waiting`.
--
-- `allow-oom`: only a place the user already held is written back.

local call = redis.call
local user, seq, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local stored = call('GET', KEYS[5])
if stored then
  return {'ADMITTED', stored}
end
local held = call('ZSCORE', KEYS[1], user)
if held then
  return {'WAITING', held, call('ZRANK', KEYS[1], user)}
end
if call('EXISTS', KEYS[7]) == 1 then
  return {'NONE'}
end
if seq < 1 or call('ZCOUNT', KEYS[1], seq, seq) > 0 then
  return {'NONE'}
end
local s = string.format('%d', seq)
local counter = tonumber(call('GET', KEYS[3]) or '0')
if counter < seq then
  -- The counter is behind a seq it handed out (signed in the ticket): Redis lost it or went
  -- back in time. Every seq after what survives may be a place a user holds: their queued bits
  -- are set, and the counter moves forward, so no seq is handed out twice and the other users
  -- of those seqs take their places back too.
  local from = math.max(counter, tonumber(call('GET', KEYS[4]) or '0')) + 1
  if seq - from <= 8388608 then
    -- Whole bytes at once (as enter.lua and advance.lua do).
    local b = from
    while b <= seq and b % 8 ~= 0 do
      call('SETBIT', KEYS[2], b, 1)
      b = b + 1
    end
    local bytes = math.floor((seq - b + 1) / 8)
    local offset = b / 8
    while bytes > 0 do
      local n = math.min(bytes, 4096)
      call('SETRANGE', KEYS[2], offset, string.rep('\255', n))
      offset, bytes, b = offset + n, bytes - n, b + 8 * n
    end
    while b <= seq do
      call('SETBIT', KEYS[2], b, 1)
      b = b + 1
    end
  end
  call('SET', KEYS[3], s, 'PX', ARGV[5])
  local losses = string.match(KEYS[1], '^(.*)waiting$') .. 'losses'
  call('HINCRBY', losses, 'seq', 1)
  -- As enter.lua and advance.lua do when they repair the counter: the heartbeats of the lost
  -- seqs went with them, so the windows restart (a sweep would read their silence and take
  -- the standing places away before their users come back), and no token is signed for two
  -- ticks and a second while the replicas write back the ones they signed.
  if call('EXISTS', KEYS[6]) == 1 then
    call('HSET', KEYS[6], 'windowSince', string.format('%d', now))
  end
  local tick_ms = tonumber(call('HGET', KEYS[6], 'tickMs') or '1000')
  call('HSET', losses, 'holdUntil', string.format('%d', now + 2 * tick_ms + 1000))
  call('PEXPIRE', losses, ARGV[5])
elseif call('GETBIT', KEYS[2], seq) == 0 then
  -- Taken away (left, evicted, issued), or never there.
  return {'NONE'}
end
call('ZADD', KEYS[1], s, user)
call('SETBIT', KEYS[2], seq, 1)
call('PEXPIRE', KEYS[1], ARGV[5])
call('PEXPIRE', KEYS[2], ARGV[5])
local prefix = string.match(KEYS[1], '^(.*)waiting$')
call('HINCRBY', prefix .. 'losses', 'waiting', 1)
call('PEXPIRE', prefix .. 'losses', ARGV[5])
if seq <= tonumber(call('GET', KEYS[4]) or '0') then
  return {'DUE'}
end
local window_ms = tonumber(call('HGET', KEYS[6], 'windowMs') or ARGV[4])
call('SETBIT', prefix .. string.format('alive:%d:%d', window_ms, math.floor(now / window_ms)), seq, 1)
return {'WAITING', s, call('ZRANK', KEYS[1], user)}
