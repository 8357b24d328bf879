#!lua flags=no-writes
-- stats.lua: cluster-wide figures of one target (SPEC §3 QueueStatsResponse), read in one step
-- so that every gateway instance answers from the same snapshot.
--
-- KEYS[1] queue:{T}:waiting, KEYS[2] queue:{T}:admitted_count, KEYS[3] queue:{T}:waits,
-- KEYS[4] queue:{T}:advances
-- ARGV[1] now (ms), ARGV[2] rate window (ms)
-- Reply: {waitingCount, admittedCount, "ratePerSec", "avgWaitSeconds", "p95WaitSeconds"}

local now, window = tonumber(ARGV[1]), tonumber(ARGV[2])

local waiting = redis.call('ZCARD', KEYS[1])
local admitted = tonumber(redis.call('GET', KEYS[2]) or '0')

-- Samples are "ms:count", newest first. The rate is the admitted_count slope over the window.
local newest_t, newest_c, oldest_t, oldest_c
for _, s in ipairs(redis.call('LRANGE', KEYS[4], 0, -1)) do
  local t, c = string.match(s, '^(%d+):(%d+)$')
  t, c = tonumber(t), tonumber(c)
  if t and now - t <= window then
    if not newest_t then newest_t, newest_c = t, c end
    oldest_t, oldest_c = t, c
  end
end
local rate = 0
if newest_t and oldest_t < newest_t then
  rate = (newest_c - oldest_c) * 1000 / (newest_t - oldest_t)
end

local waits = redis.call('LRANGE', KEYS[3], 0, -1)
local n = #waits
local avg, p95 = 0, 0
if n > 0 then
  local sum = 0
  for i = 1, n do
    waits[i] = tonumber(waits[i])
    sum = sum + waits[i]
  end
  table.sort(waits)
  avg = sum / n / 1000
  p95 = waits[math.ceil(n * 0.95)] / 1000
end

return {waiting, admitted, string.format('%.3f', rate), string.format('%.3f', avg),
  string.format('%.3f', p95)}
