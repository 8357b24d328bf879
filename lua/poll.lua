#!lua flags=allow-oom
-- poll.lua: waiting users' polls (SPEC §4 Poll): heartbeats and the admission check, one or many
-- users per call (a gateway thread gathers the polls of one target that arrive while one of its
-- calls is in flight: `store/redis/batch.rs`). A call costs ZMSCORE, GET (the mark) and one BITFIELD
-- for every heartbeat, plus a ZRANK per waiting user and a GET per user no longer waiting. It
-- signs nothing and stores no token: when a user's fixed seq is within admitted_count it answers
-- DUE, and the caller signs a token and stores it with issue.lua (once per user). It does not
-- extend the target's key TTL: enter, every admission step (advance.lua) and issue.lua do, so a
-- target with waiting users keeps its keys while its pump runs.
--
-- KEYS[1] queue:{T}:waiting, KEYS[2] queue:{T}:admitted_count, KEYS[3] queue:{T}:alive:{window}
-- ARGV[i] userId i
-- A user who is not waiting has its token read from queue:{T}:token:{userId}, a key named here
-- from KEYS[1]'s prefix rather than passed: only such users (a few) need it, and passing every
-- user's token key cost each call's users a key of ~35 bytes to send, parse and convert. It has
-- the hash tag of KEYS[1], so it is in the same cluster slot.
-- Reply: one flat array holding each user's reply in order, a tag and its fields (as enter.lua):
--   "WAITING", seq, rank | "DUE" | "ADMITTED", "expiresAt|token" | "NONE"
--
-- `allow-oom`: under maxmemory this script still runs (Redis refuses plain writes then). It only
-- refreshes state of users already in the waiting room, so a full Redis keeps the queue moving
-- instead of failing it open; new enters (enter.lua, no allow-oom) are refused.

local scores = redis.call('ZMSCORE', KEYS[1], unpack(ARGV))
local token_prefix = string.match(KEYS[1], '^(.*)waiting$') .. 'token:'
local mark = tonumber(redis.call('GET', KEYS[2]) or '0')
local out, beats = {}, {}
for i = 1, #ARGV do
  local seq = scores[i]
  if not seq then
    -- Not waiting: admitted already (the stored token, answered again), or never entered.
    local stored = redis.call('GET', token_prefix .. ARGV[i])
    if stored then
      out[#out + 1] = 'ADMITTED'
      out[#out + 1] = stored
    else
      out[#out + 1] = 'NONE'
    end
  elseif tonumber(seq) <= mark then
    out[#out + 1] = 'DUE'
  else
    -- The heartbeat: one bit. The window's bitmap gets its lifetime from enter.lua or the sweep
    -- (which also creates the next window's ahead of time), so a poll only sets the bit.
    beats[#beats + 1] = 'SET'
    beats[#beats + 1] = 'u1'
    beats[#beats + 1] = seq
    beats[#beats + 1] = '1'
    local k = #out
    out[k + 1], out[k + 2], out[k + 3] = 'WAITING', seq, redis.call('ZRANK', KEYS[1], ARGV[i])
  end
end
if #beats > 0 then
  redis.call('BITFIELD', KEYS[3], unpack(beats))
end
return out
