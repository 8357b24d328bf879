#!lua flags=allow-oom
-- sale_write.lua: creates, changes or restores a sale (`queue:{T}:sale`, a hash): the one source
-- of truth for the sale's parameters, which enter.lua, poll.lua, advance.lua and sweep.lua read
-- in the same step as the state they act on, so two replicas never apply different values to
-- one sale whatever their config files say.
--
-- KEYS[1] queue:{T}:sale, KEYS[2] queue:{T}:seq (whether anyone entered the queue yet)
-- ARGV[1] mode: "merge" (an operator's change: the given fields over the stored ones, or over
--         the defaults below for a new sale; the version goes up by one) | "restore" (a replica
--         writing back what it last read: the whole document, only when the stored one is
--         missing or older)
-- ARGV[2] now (ms), ARGV[3..] field, value pairs (merge: the changed fields, then the defaults as
--         "default:<field>", value; restore: every field)
-- Reply: the stored hash after the call as a flat array (HGETALL), whatever the mode did; or,
-- for a merge the stored sale refuses, {"REFUSED", field, why} (nothing written): the opening
-- cannot change once the draw has run, a first opening cannot be set once users queue in
-- arrival order (the draw would reshuffle places already shown), and a pre-queue opens before
-- the opening.
--
-- A stand-in that enter.lua or advance.lua made for a lost sale (field lostAtMs, paused) is
-- older than any sale a replica read: a restore always replaces it, and restarts the heartbeat
-- windows (windowSince = now: heartbeats meanwhile went to windows of the stand-in's width).
--
-- Fields: batchSize, tickMs, maxCapacity, heartbeatTimeoutS, state ("open" | "paused"), version
-- (0: created by an enter from that replica's defaults), updatedAtMs, and two derived from the
-- heartbeat timeout: windowMs (the width of the heartbeat windows, a quarter of the timeout) and
-- windowSince (when that width took effect: sweeps evict nobody until a whole timeout has passed
-- since, as the heartbeats before it are in windows of the old width, which they no longer read).
-- The schedule: opensAt and prequeueOpensAt (epoch ms, 0: none). The first merge that sets an
-- opening stores the draw's nonce and commitment (drawNonce, drawCommitment, given by the caller
-- as defaults; it refuses without them): never the seed, which only the replicas can derive
-- (src/draw.rs); draw.lua writes drawSeq, drawnAt, drawEntrants, and reveals drawSeed.
-- An operator-written sale never expires (PERSIST); one an enter created expires with the
-- target's keys.

local key, mode, now = KEYS[1], ARGV[1], tonumber(ARGV[2])
local call = redis.call

local function window_of(timeout_s)
  return math.max(1, math.floor(tonumber(timeout_s) * 1000 / 4))
end

if mode == 'restore' then
  local held = call('HMGET', key, 'version', 'lostAtMs')
  local stored = tonumber(held[1] or '-1')
  local stand_in = held[2] ~= false and held[2] ~= nil
  if stand_in then
    stored = -1
  end
  local given = {}
  for i = 3, #ARGV, 2 do
    given[ARGV[i]] = ARGV[i + 1]
  end
  if stored < tonumber(given['version']) then
    call('DEL', key)
    for i = 3, #ARGV, 2 do
      call('HSET', key, ARGV[i], ARGV[i + 1])
    end
    if stand_in then
      call('HSET', key, 'windowSince', string.format('%d', now))
    end
  end
  return call('HGETALL', key)
end

local old = {}
local flat = call('HGETALL', key)
for i = 1, #flat, 2 do
  old[flat[i]] = flat[i + 1]
end
local new, defaults = {}, {}
for i = 3, #ARGV, 2 do
  local f = ARGV[i]
  local d = string.match(f, '^default:(.+)$')
  if d then
    defaults[d] = ARGV[i + 1]
  else
    new[f] = ARGV[i + 1]
  end
end
local out = {}
for _, f in ipairs({'batchSize', 'tickMs', 'maxCapacity', 'heartbeatTimeoutS', 'state'}) do
  out[f] = new[f] or old[f] or defaults[f]
end
local drawn = tonumber(old['drawnAt'] or '0') > 0
for _, f in ipairs({'opensAt', 'prequeueOpensAt'}) do
  out[f] = new[f] or old[f] or '0'
  if drawn and tonumber(out[f]) ~= tonumber(old[f] or '0') then
    return {'REFUSED', f, 'the draw has run: the schedule can no longer change'}
  end
end
local opens, prequeue = tonumber(out['opensAt']), tonumber(out['prequeueOpensAt'])
if opens > 0 and tonumber(old['opensAt'] or '0') == 0 and tonumber(call('GET', KEYS[2]) or '0') > 0 then
  return {'REFUSED', 'opensAt',
    'users already queue in arrival order: an opening (and its draw) can only be set before the first enter'}
end
if prequeue > 0 and (opens == 0 or prequeue > opens) then
  return {'REFUSED', 'prequeueOpensAt', 'must come before opensAt (set opensAt too)'}
end
if opens > 0 and (old['drawCommitment'] or '') == '' then
  if (defaults['drawCommitment'] or '') == '' then
    return {'REFUSED', 'opensAt',
      'an opening needs the token secret (token.secret_env) to commit to the draw: set it where this runs'}
  end
  out['drawNonce'] = defaults['drawNonce']
  out['drawCommitment'] = defaults['drawCommitment']
end
local old_window = tonumber(old['windowMs'])
local window = window_of(out['heartbeatTimeoutS'])
if old_window and old_window == window then
  out['windowSince'] = old['windowSince'] or '0'
elseif old_window then
  out['windowSince'] = string.format('%d', now)
else
  out['windowSince'] = '0'
end
out['windowMs'] = string.format('%d', window)
out['version'] = string.format('%d', tonumber(old['version'] or '0') + 1)
out['updatedAtMs'] = string.format('%d', now)
local args = {}
for f, v in pairs(out) do
  args[#args + 1] = f
  args[#args + 1] = v
end
-- An operator's change is a decision: a stand-in for a lost sale becomes a sale.
call('HDEL', key, 'lostAtMs')
call('HSET', key, unpack(args))
call('PERSIST', key)
return call('HGETALL', key)
