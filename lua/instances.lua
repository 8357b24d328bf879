#!lua flags=allow-oom
-- instances.lua: the instance registry. Every gateway's pump records itself here each tick
-- (while its store answers) with the paced share it would admit per tick if it were cut off
-- from Redis, and removes itself on a clean shutdown. The answers: instances seen within the
-- live window (the replica count the fail-open pacer divides the admission budget by), within
-- the longer recent window, and the shares recorded by the instances that are recent but not
-- live: they stopped registering without a clean shutdown, may be cut off and pacing, and the
-- pump admits that much less. Timed by Redis' own clock so instances agree.
--
-- The recorded shares never add up to more than the batch: a share may grow only into what the
-- other members leave of it (an instance never records more than it asked for, and never less
-- than the smaller of what it asked for and what it held: an instance that lost the answer to
-- a registration paces with the smaller of the two, which is then never more than is recorded).
--
-- The registry also carries each instance's heartbeat credit: how long its users could not
-- heartbeat through it (a store outage, or polls it refused for saturation). Every pump's sweep
-- credits the largest one the live instances report, so a replica that sheds polls never gets
-- its users evicted by another replica's pump.
--
-- KEYS[1] queue:instances  ZSET "<instance id>|<share>" -> last seen (ms); a key of its own
--         (own slot). A member without "|" was written by a gateway that records no share.
-- KEYS[2] {queue:instances}:credit  HASH instance id -> "<credit ms>:<reported at ms>" (same slot)
-- ARGV[1] instance id (no "|"), ARGV[2] live window (ms), ARGV[3] recent window (ms),
-- ARGV[4] "register" | "leave", ARGV[5] the share asked for, ARGV[6] the batch size,
-- ARGV[7] this instance's heartbeat credit (ms)
-- Reply: {live instances, recent instances (this one included when registering),
--         sum of the shares recorded by recent instances that are not live,
--         how many of those recorded none, the share recorded for this instance,
--         the largest credit reported within the live window}

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live_window, recent_window = tonumber(ARGV[2]), tonumber(ARGV[3])
local id = ARGV[1]
local prefix = id .. '|'
local asked = math.max(0, math.floor(tonumber(ARGV[5]) or 0))
local batch = math.max(0, math.floor(tonumber(ARGV[6]) or 0))

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - recent_window)
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
local function own(m)
  return m == id or string.sub(m, 1, #prefix) == prefix
end
-- How many instances there are with this one: what a gateway that records no share divides by.
local count = 1
for _, m in ipairs(members) do
  if not own(m) then count = count + 1 end
end
-- What this instance held, and what the others hold (one that records none: its ceil share).
local held, others = 0, 0
for _, m in ipairs(members) do
  local share = string.match(m, '|(%d+)$')
  if own(m) then
    held = tonumber(share or '0')
    redis.call('ZREM', KEYS[1], m)
  elseif share then
    others = others + tonumber(share)
  else
    others = others + math.ceil(batch / count)
  end
end

local recorded = 0
if ARGV[4] ~= 'leave' then
  recorded = math.min(asked, math.max(held, batch - others))
  redis.call('ZADD', KEYS[1], now, prefix .. recorded)
end
redis.call('PEXPIRE', KEYS[1], recent_window * 2)

local reserved, unrecorded = 0, 0
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - live_window))) do
  local share = string.match(m, '|(%d+)$')
  if share then
    reserved = reserved + tonumber(share)
  else
    unrecorded = unrecorded + 1
  end
end
local credit = math.max(0, math.floor(tonumber(ARGV[7]) or 0))
if credit > 0 and ARGV[4] ~= 'leave' then
  redis.call('HSET', KEYS[2], id, credit .. ':' .. now)
else
  redis.call('HDEL', KEYS[2], id)
end
local largest = 0
local entries = redis.call('HGETALL', KEYS[2])
for i = 1, #entries, 2 do
  local c, at = string.match(entries[i + 1], '^(%d+):(%d+)$')
  if c and tonumber(at) >= now - live_window then
    largest = math.max(largest, tonumber(c))
  else
    redis.call('HDEL', KEYS[2], entries[i])
  end
end
redis.call('PEXPIRE', KEYS[2], recent_window * 2)

return {redis.call('ZCOUNT', KEYS[1], now - live_window, '+inf'), redis.call('ZCARD', KEYS[1]),
        reserved, unrecorded, recorded, largest}
