#!lua flags=allow-oom
-- stats.lua: cluster-wide figures of one target (docs/api.md#endpoints), read in one step
-- so that every gateway instance answers from the same snapshot.
--
-- O(1) per call: the wait percentiles need a sort of up to 1,024 samples, so the result is kept
-- in a summary hash and recomputed only when it is older than ARGV[3] ms or the samples changed
-- (newest wait, sample count or newest advance differ: each an O(1) read). Callers cache per
-- replica on top; a flood of stats calls therefore costs Redis a few cheap reads a second.
--
-- KEYS[1] queue:{T}:waiting, KEYS[2] queue:{T}:admitted_count, KEYS[3] queue:{T}:waits,
-- KEYS[4] queue:{T}:advances, KEYS[5] queue:{T}:summary (HASH at, version, rate, avg, p95)
-- ARGV[1] now (ms), ARGV[2] rate window (ms), ARGV[3] summary max age (ms), ARGV[4] key TTL (ms)
-- Reply: {waitingCount, admittedCount, "ratePerSec", "avgWaitSeconds", "p95WaitSeconds",
--         "liveRatePerSec"} (the rate of live users admitted: what an ETA divides by)
--
-- allow-oom: the summary hash has a fixed size, so refreshing it under maxmemory is harmless.

local now, window, max_age = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

local waiting = redis.call('ZCARD', KEYS[1])
local admitted = tonumber(redis.call('GET', KEYS[2]) or '0')

local version = table.concat({
  redis.call('LLEN', KEYS[3]),
  redis.call('LINDEX', KEYS[3], 0) or '',
  redis.call('LINDEX', KEYS[4], 0) or '',
}, '/')
local s = redis.call('HMGET', KEYS[5], 'at', 'version', 'rate', 'avg', 'p95', 'live')
local at = tonumber(s[1])
if at and s[2] == version and now >= at and now - at < max_age and s[6] then
  return {waiting, admitted, s[3], s[4], s[5], s[6]}
end

-- Samples are "ms:mark:live", newest first. The rate is the admitted_count slope over the
-- window; the live rate the slope of the live users admitted.
local newest_t, newest_c, newest_l, oldest_t, oldest_c, oldest_l
for _, sample in ipairs(redis.call('LRANGE', KEYS[4], 0, -1)) do
  local t, c, l = string.match(sample, '^(%d+):(%d+):(%d+)$')
  t, c, l = tonumber(t), tonumber(c), tonumber(l)
  if t and now - t <= window then
    if not newest_t then newest_t, newest_c, newest_l = t, c, l end
    oldest_t, oldest_c, oldest_l = t, c, l
  end
end
local rate, live = 0, 0
if newest_t and oldest_t < newest_t then
  rate = (newest_c - oldest_c) * 1000 / (newest_t - oldest_t)
  live = (newest_l - oldest_l) * 1000 / (newest_t - oldest_t)
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

local r, a, p = string.format('%.3f', rate), string.format('%.3f', avg), string.format('%.3f', p95)
local lr = string.format('%.3f', live)
if waiting > 0 or admitted > 0 or n > 0 then
  -- Unknown targets leave no state behind.
  redis.call('HSET', KEYS[5], 'at', now, 'version', version, 'rate', r, 'avg', a, 'p95', p,
    'live', lr)
  redis.call('PEXPIRE', KEYS[5], ARGV[4])
end
return {waiting, admitted, r, a, p, lr}
