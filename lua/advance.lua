#!lua flags=allow-oom
-- advance.lua: one admission step of a target (docs/ARCHITECTURE.md#the-admission-pump). Moves
-- admitted_count so that exactly the next `batch` live waiting users above the mark are admitted
-- (users who left or were evicted take no slot); with fewer waiting, up to the current seq. Never
-- backwards, never beyond seq.
--
-- The cluster-wide bound lives here, not in the lock: the script refuses a second advance of the
-- same target within `min_interval` ms of the last one, timed by Redis' own clock (TIME), so a
-- paused lock holder, a lost reply, a retried call or a second instance cannot double-advance.
--
-- KEYS[1..7] as in enter.lua (waiting, queued, seq, admitted_count, seqtime, waits, advances:
--            samples "ms:mark:live", newest first)
-- KEYS[8]    queue:{T}:last_advance  STRING, Redis time (ms) of the last advance
-- KEYS[9]    queue:{T}:sale          HASH: batchSize, tickMs, state (sale_write.lua), read here so
--                                    that every replica's pump admits the sale's own budget
-- KEYS[10]   queue:{T}:losses        HASH kind -> count: the losses of this target's state the
--                                    scripts found (declared: it is read at every step, and a
--                                    cluster refuses undeclared keys of a slot in migration)
-- KEYS[11]   queue:{T}:deleted       set while an operator's deletion of the sale is recent: the
--                                    caller's memory is of the deleted queue, no floor
-- ARGV[1] the part of the batch the caller may admit, in millionths (less than all of it while
-- replicas that stopped registering may be pacing on their own), ARGV[2] key TTL (ms), ARGV[3]
-- samples to keep, ARGV[4] and ARGV[5] the caller's default batchSize and tickMs (a sale that
-- does not exist: lost with Redis' data), ARGV[6] the slices (share.rs) that bound this step in
-- its tick (now over the sale's tickMs): "" none, "=start:end" only what this slice admits (a
-- pump whose registration failed), "-start:end,..." less what these admit (replicas that may
-- be pacing on their own), ARGV[7] the highest mark the calling replica has seen, ARGV[8] the
-- highest seq, ARGV[9] the highest version of the sale it has read (0: none), ARGV[10] and
-- ARGV[11] the caller's default maxCapacity and heartbeatTimeoutS (for a lost sale's stand-in)
-- Reply: {outcome, admitted_count, newly admitted live users, waiting count, ms until allowed,
--         the sale's batchSize, the sale's tickMs, seq, losses: "kind=count,..." (the counts in
--         queue:{T}:losses, named from KEYS[1]'s prefix)}
--
-- Losses (docs/state.md), checked before anything is admitted: a mark below the highest one
-- a replica saw (lost, or Redis came back from a failover behind) is set back to it, so no user
-- is admitted twice; a seq below the mark, the highest waiting score or the highest seq a
-- replica saw is set back to their maximum, so no seq is handed out twice; a sale an operator
-- had set (a replica read a version above 0) found missing is recreated paused and marked
-- `lost`, and nobody is admitted from made-up parameters until a replica writes back the one
-- it read; one an enter had made from the defaults is made again from them. A repaired mark or
-- seq holds the sale for two ticks and a second (holdUntil in KEYS[10]): see below.
--   outcome: "ADVANCED" | "GUARDED" (too soon after the last advance: 0.95 of the sale's tick;
--   the 5th element says how long until the next advance is allowed) | "IDLE" (nobody to admit)
--   | "PAUSED" (the sale's state is paused: nobody is admitted, everyone keeps their place)
--   | "PREQUEUE" (an opening is announced and the draw has not run; the 5th element: ms until
--   the opening, 0 once it is due and the caller should run the draw)
--
-- `allow-oom`: under maxmemory this script still runs (Redis refuses plain writes then). It only
-- refreshes or removes state of users already admitted to the waiting room, so a full Redis keeps
-- the queue moving instead of failing it open; new enters (enter.lua, no allow-oom) are refused.

local share_ppm, ttl = tonumber(ARGV[1]), ARGV[2]
local losses_key = KEYS[10]
local function lost(kind)
  redis.call('HINCRBY', losses_key, kind, 1)
  redis.call('PEXPIRE', losses_key, ttl)
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

-- The state's invariants, repaired from what survives and from the caller's memory.
local mark_floor, seq_floor = tonumber(ARGV[7]) or 0, tonumber(ARGV[8]) or 0
local deleted = redis.call('EXISTS', KEYS[11])
if deleted == 1 then
  mark_floor, seq_floor = 0, 0
end
local mark_raw, seq_raw = redis.call('GET', KEYS[4]), redis.call('GET', KEYS[3])
local restart_windows = false
local top = tonumber(redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2] or '0')
local repaired = false
if tonumber(mark_raw or '0') < mark_floor then
  redis.call('SET', KEYS[4], string.format('%d', mark_floor), 'PX', ttl)
  lost('mark')
  repaired = true
end
local want_seq = math.max(seq_floor, top, mark_floor, tonumber(mark_raw or '0'))
if tonumber(seq_raw or '0') < want_seq then
  redis.call('SET', KEYS[3], string.format('%d', want_seq), 'PX', ttl)
  -- The seqs above what survives may still be places users hold (rejoin.lua).
  -- (From what survived: places between the surviving mark and the repaired one were admitted,
  -- and their users take them back as admitted, rejoin.lua.)
  standing(KEYS[2], math.max(tonumber(seq_raw or '0'), tonumber(mark_raw or '0')) + 1, want_seq)
  redis.call('PEXPIRE', KEYS[2], ttl)
  lost('seq')
  restart_windows = true
  repaired = true
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if restart_windows and redis.call('EXISTS', KEYS[9]) == 1 then
  -- The heartbeats of the lost seqs went with them: the windows restart (sweep.lua).
  redis.call('HSET', KEYS[9], 'windowSince', string.format('%d', now))
end
if redis.call('EXISTS', KEYS[9]) == 0 then
  local known = tonumber(ARGV[9]) or 0
  if deleted == 1 then
    known = 0
  end
  if known > 0 or top > 0 or want_seq > 0 then
    -- Lost. One an operator had set (the caller read a version above 0) becomes a paused
    -- stand-in until a replica writes it back; one an enter made from the defaults is made
    -- again from them. The heartbeat windows restart either way.
    local at = string.format('%d', now)
    local window = math.max(1, math.floor(tonumber(ARGV[11]) * 1000 / 4))
    redis.call('HSET', KEYS[9], 'batchSize', ARGV[4], 'tickMs', ARGV[5], 'maxCapacity', ARGV[10],
      'heartbeatTimeoutS', ARGV[11], 'state', known > 0 and 'paused' or 'open',
      'windowMs', string.format('%d', window), 'windowSince', at, 'version', '0',
      'updatedAtMs', at)
    if known > 0 then
      redis.call('HSET', KEYS[9], 'lostAtMs', at)
    end
    redis.call('PEXPIRE', KEYS[9], ttl)
    lost('sale')
  end
end
local function losses()
  local flat = redis.call('HGETALL', losses_key)
  local parts = {}
  for i = 1, #flat, 2 do
    if flat[i] ~= 'holdUntil' then
      parts[#parts + 1] = flat[i] .. '=' .. flat[i + 1]
    end
  end
  return table.concat(parts, ',')
end

local sale = redis.call('HMGET', KEYS[9], 'batchSize', 'tickMs', 'state', 'opensAt', 'drawnAt')
local batch_size = tonumber(sale[1] or ARGV[4])
local tick_ms = tonumber(sale[2] or ARGV[5])
local batch = math.floor(batch_size * share_ppm / 1000000)
-- What was lost with the mark or the seq may include tokens signed and claims spent: every
-- replica learns of the loss at its next registration (the pump reports it to the roster) and
-- writes back what it remembers. Until then (two ticks and a second) nobody is admitted and no
-- token is signed (issue.lua reads holdUntil).
if repaired then
  redis.call('HSET', losses_key, 'holdUntil', string.format('%d', now + 2 * tick_ms + 1000))
  redis.call('PEXPIRE', losses_key, ttl)
end
if tonumber(redis.call('HGET', losses_key, 'holdUntil') or '0') > now then
  batch = 0
end

-- A slice's users in tick `tick` (share.rs: cells of a 64-tick frame, ticks bit-reversed).
local UNIT, FRAME = 1000000, 64
local function cells(s, e, tick)
  if e <= s or batch_size <= 0 then return 0 end
  local total = batch_size * FRAME
  local lo = math.floor((s * total + UNIT - 1) / UNIT)
  local hi = math.floor((e * total + UNIT - 1) / UNIT)
  local x, r = tick % FRAME, 0
  for _ = 1, 6 do
    r = r * 2 + x % 2
    x = math.floor(x / 2)
  end
  local function upto(v)
    if v <= r then return 0 end
    return math.floor((v - r - 1) / FRAME) + 1
  end
  return upto(hi) - upto(lo)
end
local part = ARGV[6] or ''
if part ~= '' then
  local tick = math.floor(now / tick_ms)
  local sum = 0
  for s, e in string.gmatch(string.sub(part, 2), '(%d+):(%d+)') do
    sum = sum + cells(math.min(tonumber(s), UNIT), math.min(tonumber(e), UNIT), tick)
  end
  if string.sub(part, 1, 1) == '=' then
    batch = math.min(batch, sum)
  else
    batch = math.max(0, batch - sum)
  end
end
local min_interval = math.floor(tick_ms * 0.95)
local function reply(outcome, mark, admitted, waiting, retry)
  return {outcome, mark, admitted, waiting, retry, batch_size, tick_ms,
    tonumber(redis.call('GET', KEYS[3]) or '0'), losses(), deleted}
end

local mark = tonumber(redis.call('GET', KEYS[4]) or '0')
local waiting = redis.call('ZCARD', KEYS[1])
if sale[3] == 'paused' then
  return reply('PAUSED', mark, 0, waiting, 0)
end
local opens_at = tonumber(sale[4] or '0')
if opens_at > 0 and tonumber(sale[5] or '0') == 0 then
  -- Pre-queued: nobody is admitted before the draw (draw.lua) gives them their places.
  return reply('PREQUEUE', mark, 0, waiting, math.max(0, opens_at - now))
end

local last = tonumber(redis.call('GET', KEYS[8]) or '0')
if now - last < min_interval then
  return reply('GUARDED', mark, 0, waiting, min_interval - (now - last))
end

local seq = tonumber(redis.call('GET', KEYS[3]) or '0')
local above = string.format('(%d', mark)
local live_above = redis.call('ZCOUNT', KEYS[1], above, '+inf')
if live_above == 0 or mark >= seq or batch <= 0 then
  return reply('IDLE', mark, 0, waiting, 0)
end

local new_mark = seq
local admitted = live_above
if live_above > batch then
  local nth = redis.call('ZRANGEBYSCORE', KEYS[1], above, '+inf', 'WITHSCORES', 'LIMIT', batch - 1, 1)
  new_mark = tonumber(nth[2])
  admitted = batch
end

redis.call('SET', KEYS[4], string.format('%d', new_mark))
-- Enter-time checkpoints below the one covering the lowest waiting seq are no longer needed.
local lowest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
if lowest then
  local cover = redis.call('ZREVRANGEBYSCORE', KEYS[5], lowest, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)[2]
  if cover then
    redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', '(' .. cover)
  end
end
redis.call('SET', KEYS[8], string.format('%d', now), 'PX', ttl)
-- A sample is "ms:mark:live": the mark, and the live users admitted since the sequence began
-- (the mark also moves over users who left: the live count is what an ETA divides by).
local prev = redis.call('LINDEX', KEYS[7], 0)
local prev_live = prev and tonumber(string.match(prev, '^%d+:%d+:(%d+)$')) or 0
redis.call('LPUSH', KEYS[7], string.format('%d:%d:%d', now, new_mark, prev_live + admitted))
redis.call('LTRIM', KEYS[7], 0, tonumber(ARGV[3]) - 1)
for i = 1, 7 do
  redis.call('PEXPIRE', KEYS[i], ttl)
end
redis.call('PEXPIRE', KEYS[9], ttl, 'GT')
return reply('ADVANCED', new_mark, admitted, waiting, 0)
