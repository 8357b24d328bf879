#!lua
-- enter.lua: users join a target's waiting room (docs/api.md#enter), one or many per call: a
-- gateway thread gathers the enters of one target that arrive while one of its calls is in flight
-- and sends them as one call (`store/redis/batch.rs`). The answers are those of the same enters
-- made one after another in the order given: concurrent duplicate enters of one user get one seq
-- and waste none, and the capacity check cannot race the INCRBY. The commands are per call, not per
-- user (ZMSCORE, MGET of the tokens of the users not waiting, one INCRBY, one ZADD, one BITFIELD
-- per bitmap), except ZRANK for a user who was already waiting; the bits of the new users'
-- consecutive seqs are written as runs.
--
-- KEYS[1] queue:{T}:waiting         ZSET userId -> seq
-- KEYS[2] queue:{T}:queued          bitmap by seq: 1 while that seq waits (for the sweep)
-- KEYS[3] queue:{T}:seq             STRING, INCRBY
-- KEYS[4] queue:{T}:admitted_count  STRING
-- KEYS[5] queue:{T}:seqtime         ZSET "seq:ms" -> seq: sparse enter-time checkpoints, for wait
--                                    statistics (a new one after 16 seqs or 1 s; ~6 bytes a user
--                                    instead of a timestamp per user)
-- KEYS[6] queue:{T}:waits           LIST of admission waits (ms)
-- KEYS[7] queue:{T}:advances        LIST of "ms:admitted_count" samples
-- KEYS[8] queue:{T}:sale            HASH: the sale's parameters (sale_write.lua): the capacity
--                                    (maxCapacity) and the heartbeat window width (windowMs) are
--                                    read from it, never from the caller, so replicas whose config
--                                    files differ still apply one capacity and one window to a sale
-- ARGV[1] now (ms), ARGV[2] key TTL (ms), ARGV[3..6] the caller's defaults for a sale that does
-- not exist yet (batchSize, tickMs, maxCapacity, heartbeatTimeoutS): the first enter creates it
-- with them (version 0, expiring with the target's keys), ARGV[7] the highest seq the calling
-- replica has seen for this target, ARGV[8] the highest version of the sale it has read (0:
-- none), ARGV[8+i] userId i
--
-- Losses (docs/state.md): a missing `seq` next to a mark, waiting users or a replica that saw
-- seqs is a lost key, never a fresh sequence: it is set back to the highest of them before any
-- seq is handed out, so no place is given twice. A missing sale that an operator had set (the
-- replica read a version above 0) is created paused and marked `lost` (nobody is admitted from
-- made-up parameters) until a replica writes back what it last read; one an enter had made from
-- the defaults (next to queue state) is made again from them. Each loss found is
-- counted in queue:{T}:losses (HASH kind -> count, named here from KEYS[1]'s prefix), which the
-- pump reports.
-- The heartbeats of the current window go to queue:{T}:alive:{windowMs}:{now / windowMs}, a bitmap
-- by seq named here (same hash tag, same slot) because its name depends on the sale's width.
-- A user's token (STRING "expiresAt|token") is at queue:{T}:token:{userId}, a key named here from
-- KEYS[1]'s prefix rather than passed (it has KEYS[1]'s hash tag, so it is in the same cluster
-- slot), and read only for the users not waiting: a user still waiting holds no token (issue.lua
-- stores a token and takes its user out of the waiting set in one step). Passing every user's
-- token key cost each call a key of ~35 bytes per user to send, parse and convert, and a lookup.
-- Reply: one flat array holding each user's reply in order, a tag and its fields:
--   "ADMITTED", "expiresAt|token" | "WAITING", seq, rank, opened | "FULL" | "EARLY" (the
--   sale's pre-queue opens later: prequeueOpensAt)
--   (one array, not a table per user: Redis converts the values of one array for less than the
--   same values in a table each)
--   opened: 1 when this enter put the first user into an empty waiting room (the caller then
--   makes sure the target is on `queue:active`: the pump may have retired it as empty)
--
-- Key lifetimes: every key this script may create gets the TTL in the same call (a fresh
-- sequence, an empty waiting room, the first checkpoint), and the TTL of all seven is extended by
-- the first checkpoint of each second (a checkpoint comes after 16 enters or a second) and by
-- every admission step (advance.lua), not on every enter.
--
-- The `#!lua` shebang (no allow-oom flag) makes Redis refuse the whole script under maxmemory
-- before it runs, instead of failing at its first write and keeping the writes before it.

local now, ttl = tonumber(ARGV[1]), ARGV[2]
local n = #ARGV - 8
local call = redis.call
local users = {}
for i = 1, n do
  users[i] = ARGV[8 + i]
end
local prefix = string.match(KEYS[1], '^(.*)waiting$')
local function lost(kind)
  call('HINCRBY', prefix .. 'losses', kind, 1)
  call('PEXPIRE', prefix .. 'losses', ttl)
end

-- Sets the queued bits of seqs from..to (a range of seqs handed out that Redis lost: their places
-- may still stand, and their users take them back with their tickets, rejoin.lua). Whole bytes
-- at once; at most 8M seqs.
local function standing(key, from, to)
  if to < from or to - from > 8388608 then
    return
  end
  local s = from
  while s <= to and s % 8 ~= 0 do
    redis.call('SETBIT', key, s, 1)
    s = s + 1
  end
  local bytes = math.floor((to - s + 1) / 8)
  local offset = s / 8
  while bytes > 0 do
    local n = math.min(bytes, 4096)
    redis.call('SETRANGE', key, offset, string.rep('\255', n))
    offset, bytes, s = offset + n, bytes - n, s + 8 * n
  end
  while s <= to do
    redis.call('SETBIT', key, s, 1)
    s = s + 1
  end
end

-- The sale: created from the caller's defaults by the first enter of a target nobody created.
local sale_key = KEYS[8]
local sale = call('HMGET', sale_key, 'maxCapacity', 'windowMs', 'prequeueOpensAt')
local capacity, window_ms = tonumber(sale[1]), tonumber(sale[2])
if now < tonumber(sale[3] or '0') then
  -- Before the pre-queue opens: nobody enters (nothing written).
  local early = {}
  for i = 1, n do
    early[i] = 'EARLY'
  end
  return early
end
-- The sequence: a missing one is repaired from what survives (the mark, the waiting set, the
-- calling replica's memory) before anything is handed out.
local seq_now = call('GET', KEYS[3])
local mark_now = call('GET', KEYS[4])
local top = call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
local remembered, known = tonumber(ARGV[7]) or 0, tonumber(ARGV[8]) or 0
if (not seq_now or not window_ms) and call('EXISTS', prefix .. 'deleted') == 1 then
  -- An operator deleted the sale lately (queue:{T}:deleted): the caller remembers the deleted
  -- queue, which is no floor for a new one.
  remembered, known = 0, 0
end
local floor = math.max(remembered, tonumber(mark_now or '0'), tonumber(top or '0'))
if (not seq_now and floor > 0) or (seq_now and tonumber(seq_now) < floor) then
  -- Missing, or below a seq already handed out (rolled back, or set by hand): never reused.
  -- The seqs above what survives may still be places users hold.
  call('SET', KEYS[3], string.format('%d', floor), 'PX', ttl)
  standing(KEYS[2], math.max(tonumber(seq_now or '0'), tonumber(mark_now or '0')) + 1, floor)
  call('PEXPIRE', KEYS[2], ttl)
  -- Their heartbeats went with them: the windows restart, so nobody's silence is read into it.
  if window_ms then
    call('HSET', sale_key, 'windowSince', ARGV[1])
  end
  lost('seq')
  -- Tokens signed in what was lost may be gone too: none is signed anew until every replica
  -- has learned of the loss and written back its own (issue.lua, advance.lua: two ticks and a
  -- second).
  local tick_ms = tonumber(call('HGET', sale_key, 'tickMs') or ARGV[4])
  call('HSET', prefix .. 'losses', 'holdUntil', string.format('%d', now + 2 * tick_ms + 1000))
end
if not window_ms then
  capacity = tonumber(ARGV[5])
  window_ms = math.max(1, math.floor(tonumber(ARGV[6]) * 1000 / 4))
  local has_state = floor > 0 or seq_now or call('EXISTS', KEYS[4]) == 1
  if known > 0 then
    -- Lost, and an operator had set it: paused until a replica writes back the sale it read;
    -- the heartbeat windows restart (windowSince) since nobody's silence was observed in them.
    call('HSET', sale_key, 'batchSize', ARGV[3], 'tickMs', ARGV[4], 'maxCapacity', ARGV[5],
      'heartbeatTimeoutS', ARGV[6], 'state', 'paused', 'windowMs', string.format('%d', window_ms),
      'windowSince', ARGV[1], 'version', '0', 'updatedAtMs', ARGV[1], 'lostAtMs', ARGV[1])
    lost('sale')
  elseif has_state then
    -- Lost, and it was one an enter made from the defaults (version 0): made again the same way.
    call('HSET', sale_key, 'batchSize', ARGV[3], 'tickMs', ARGV[4], 'maxCapacity', ARGV[5],
      'heartbeatTimeoutS', ARGV[6], 'state', 'open', 'windowMs', string.format('%d', window_ms),
      'windowSince', ARGV[1], 'version', '0', 'updatedAtMs', ARGV[1])
    lost('sale')
  else
    call('HSET', sale_key, 'batchSize', ARGV[3], 'tickMs', ARGV[4], 'maxCapacity', ARGV[5],
      'heartbeatTimeoutS', ARGV[6], 'state', 'open', 'windowMs', string.format('%d', window_ms),
      'windowSince', '0', 'version', '0', 'updatedAtMs', ARGV[1])
  end
  call('PEXPIRE', sale_key, ttl)
end
-- A window's bitmap lives past the last sweep that may read it (12 windows, sweep.lua).
local window_ttl = string.format('%d', 14 * window_ms)
local window_key = string.match(KEYS[1], '^(.*)waiting$') ..
  string.format('alive:%d:%d', window_ms, math.floor(now / window_ms))

local scores = call('ZMSCORE', KEYS[1], unpack(users))
local token_prefix = string.match(KEYS[1], '^(.*)waiting$') .. 'token:'
local stored, asked, at, na = {}, {}, {}, 0
for i = 1, n do
  if not scores[i] then
    na = na + 1
    at[na] = i
    asked[na] = token_prefix .. users[i]
  end
end
if na > 0 then
  local got = call('MGET', unpack(asked))
  for j = 1, na do
    stored[at[j]] = got[j]
  end
end
local waiting = call('ZCARD', KEYS[1])
local before = waiting

-- First pass: each user's answer in order; new users get their place (an index into the new
-- seqs) while there is room, and a repeated new user gets the place of its first enter. The user
-- at place p waits behind `before + p - 1` users and opened the room when `before` was 0 and p 1.
local replies, fresh, places, nfresh = {}, {}, {}, 0
for i = 1, n do
  local user = users[i]
  if stored[i] then
    replies[i] = 'admitted'
  elseif scores[i] then
    replies[i] = 'known'
  elseif fresh[user] then
    replies[i] = 'again'
  elseif waiting >= capacity then
    replies[i] = 'full'
  else
    nfresh = nfresh + 1
    fresh[user] = nfresh
    places[nfresh] = user
    waiting = waiting + 1
  end
end

-- BITFIELD arguments that set the bits of the new seqs (places 1 .. nfresh, consecutive): one
-- field of up to 32 bits per 32 seqs instead of one per seq. Every argument is a string made
-- with '%d' (Redis would format a Lua number with '%.17g', and `tostring` uses '%.14g': both
-- far slower than an integer format).
local function runs_of_new_bits(seqs, nfresh)
  local args, p, a = {}, 1, 0
  while p <= nfresh do
    local len = math.min(nfresh - p + 1, 32)
    args[a + 1], args[a + 2], args[a + 3], args[a + 4] =
      'SET', string.format('u%d', len), seqs[p], string.format('%d', 2 ^ len - 1)
    a = a + 4
    p = p + len
  end
  return args
end

-- The bits of the new seqs, in the queued bitmap now and in the heartbeat bitmap below.
local first, seqs, bits = 0, {}, {}
if nfresh > 0 then
  local last = call('INCRBY', KEYS[3], nfresh)
  first = last - nfresh + 1
  if first == 1 then
    -- A fresh sequence (no mark, nobody waiting, no replica saw a seq: see above): stale queued
    -- bits and samples left behind would name new users.
    call('DEL', KEYS[2], KEYS[7])
  end
  local zadd = {}
  for p = 1, nfresh do
    local s = string.format('%d', first + p - 1)
    seqs[p] = s
    zadd[2 * p - 1] = s
    zadd[2 * p] = places[p]
  end
  call('ZADD', KEYS[1], unpack(zadd))
  bits = runs_of_new_bits(seqs, nfresh)
  call('BITFIELD', KEYS[2], unpack(bits))
end

-- Second pass: the answers, in order, and the heartbeats of waiting users (one bit each in this
-- window's bitmap, which expires on its own: NX, the first writer of a window sets its lifetime).
-- The new seqs beat as one run of bits; users already waiting beat one bit each.
local out, beats, k, b = {}, bits, 0, #bits
local waiting_key = KEYS[1]
for i = 1, n do
  local r = replies[i]
  if r == 'admitted' then
    out[k + 1], out[k + 2] = 'ADMITTED', stored[i]
    k = k + 2
  elseif r == 'full' then
    k = k + 1
    out[k] = 'FULL'
  elseif r == 'known' then
    local s = scores[i]
    out[k + 1], out[k + 2], out[k + 3], out[k + 4] =
      'WAITING', s, call('ZRANK', waiting_key, users[i]), 0
    beats[b + 1], beats[b + 2], beats[b + 3], beats[b + 4] = 'SET', 'u1', s, '1'
    k, b = k + 4, b + 4
  else
    -- A new user ('again': its second enter in this call).
    local place = fresh[users[i]]
    out[k + 1], out[k + 2], out[k + 3], out[k + 4] = 'WAITING', seqs[place], before + place - 1,
      (r == nil and before == 0 and place == 1) and 1 or 0
    k = k + 4
  end
end
if b > 0 then
  call('BITFIELD', window_key, unpack(beats))
  call('PEXPIRE', window_key, window_ttl, 'NX')
end

if nfresh > 0 then
  local s = first + nfresh - 1
  local last = call('ZREVRANGE', KEYS[5], 0, 0)[1]
  local last_seq, last_ms = 0, 0
  if last then
    last_seq, last_ms = string.match(last, '^(%d+):(%d+)$')
    last_seq, last_ms = tonumber(last_seq), tonumber(last_ms)
  end
  local checkpoint = not last or s - last_seq >= 16 or now - last_ms >= 1000
  if checkpoint then
    -- Every seq up to s entered by now (the users of one call enter at the same time).
    call('ZADD', KEYS[5], seqs[nfresh], seqs[nfresh] .. ':' .. ARGV[1])
  end
  -- The TTLs: set with whatever this call may have created (a fresh sequence, an empty waiting
  -- room, the first checkpoint), and otherwise extended by the first checkpoint of each second
  -- (checkpoints come at least once a second while users enter) rather than by every one.
  if not last or first == 1 or before == 0
    or (checkpoint and math.floor(now / 1000) ~= math.floor(last_ms / 1000)) then
    for k = 1, 7 do
      call('PEXPIRE', KEYS[k], ttl)
    end
    -- GT: a sale an operator created (no expiry) keeps none; one an enter created lives on.
    call('PEXPIRE', sale_key, ttl, 'GT')
  end
end
return out
