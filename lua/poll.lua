#!lua flags=allow-oom
-- poll.lua: waiting users' polls (docs/api.md#poll): heartbeats and the admission check, one or
-- many users per call (a gateway thread gathers the polls of one target that arrive while one of
-- its calls is in flight: `store/redis/batch.rs`). A call costs ZMSCORE, GET (the mark) and one
-- BITFIELD for every heartbeat, plus a ZRANK per waiting user and a GET per user no longer waiting.
-- It signs nothing and stores no token: when a user's fixed seq is within admitted_count it answers
-- DUE, and the caller signs a token and stores it with issue.lua (once per user). It does not
-- extend the target's key TTL: enter, every admission step (advance.lua) and issue.lua do, so a
-- target with waiting users keeps its keys while its pump runs.
--
-- KEYS[1] queue:{T}:waiting, KEYS[2] queue:{T}:admitted_count, KEYS[3] queue:{T}:sale (its
-- windowMs: the heartbeat window's width; the bitmap is queue:{T}:alive:{windowMs}:{now/windowMs}),
-- KEYS[4] that bitmap as the caller names it from the width it last read (used when it is the
-- one the sale's width names: the usual case; else the script names it)
-- ARGV[1] now (ms), ARGV[2] the caller's default window width (a sale that does not exist: lost
-- with Redis' data, until a replica writes it back), ARGV[2+i] userId i
-- A user who is not waiting has its token read from queue:{T}:token:{userId}, a key named here
-- from KEYS[1]'s prefix rather than passed: only such users (a few) need it, and passing every
-- user's token key cost each call's users a key of ~35 bytes to send, parse and convert. It has
-- the hash tag of KEYS[1], so it is in the same cluster slot.
-- Reply: one flat array holding each user's reply in order, a tag and its fields (as enter.lua):
--   "WAITING", seq, rank, mark | "DUE" | "ADMITTED", "expiresAt|token" | "NONE"
--   (the mark with every waiting answer: every replica learns it, not only the pump's, so a
--   queue ticket at or below it gives no admission while the store is down, failopen.rs)
--
-- `allow-oom`: under maxmemory this script still runs (Redis refuses plain writes then). It only
-- refreshes state of users already in the waiting room, so a full Redis keeps the queue moving
-- instead of failing it open; new enters (enter.lua, no allow-oom) are refused.

local call, waiting = redis.call, KEYS[1]
local now = tonumber(ARGV[1])
local users = {}
for i = 3, #ARGV do
  users[i - 2] = ARGV[i]
end
local window_ms = tonumber(call('HGET', KEYS[3], 'windowMs') or ARGV[2])
local window_key = string.match(waiting, '^(.*)waiting$') ..
  string.format('alive:%d:%d', window_ms, math.floor(now / window_ms))
if KEYS[4] == window_key then
  -- The caller named it right (its view of the sale's width is current): a declared key, which
  -- a cluster moving this slot redirects like the others instead of refusing the script.
  window_key = KEYS[4]
end
local scores = call('ZMSCORE', waiting, unpack(users))
local token_prefix = string.match(waiting, '^(.*)waiting$') .. 'token:'
local mark = tonumber(call('GET', KEYS[2]) or '0')
local out, beats, o, b = {}, {}, 0, 0
for i = 1, #users do
  local seq = scores[i]
  if not seq then
    -- Not waiting: admitted already (the stored token, answered again), or never entered.
    local stored = call('GET', token_prefix .. users[i])
    if stored then
      out[o + 1], out[o + 2] = 'ADMITTED', stored
      o = o + 2
    else
      o = o + 1
      out[o] = 'NONE'
    end
  elseif tonumber(seq) <= mark then
    o = o + 1
    out[o] = 'DUE'
  else
    -- The heartbeat: one bit. The window's bitmap gets its lifetime from enter.lua or the sweep
    -- (which also creates the next window's ahead of time), so a poll only sets the bit.
    beats[b + 1], beats[b + 2], beats[b + 3], beats[b + 4] = 'SET', 'u1', seq, '1'
    b = b + 4
    out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 'WAITING', seq, call('ZRANK', waiting, users[i]), mark
    o = o + 4
  end
end
if b > 0 then
  call('BITFIELD', window_key, unpack(beats))
end
return out
