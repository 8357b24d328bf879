#!lua flags=allow-oom
-- claim.lua: one entry token's single-use claim (docs/security.md), as the gate takes and settles
-- it. A claim is pending while its purchase is in flight, under a lease the forwarding replica
-- renews; a 2xx or 3xx answer spends it, a 4xx or 5xx gives it back, and a lease that lapses (the
-- forwarding replica died) gives it back too. One token is tried at most `max attempts` times in
-- all: a client that makes the backend fail on purpose gets bounded attempts. `allow-oom`: under
-- maxmemory Redis refuses plain writes, and a claim that cannot be recorded would leave the token
-- reusable. The hash is tiny and bounded by the admission budget.
--
-- KEYS[1] queue:{T}:used:{tokenId}  HASH state ("pending" | "spent" | "free"), owner (the
--         purchase attempt's id), attempts, lease (Redis ms the pending claim holds until).
--         A string there is a claim of an older version (SET NX): spent.
-- KEYS[2] queue:{T}:spent  ZSET tokenId -> Redis ms until which it is kept: every spent token of
--         the sale, a second record of the spend (docs/state.md: the loss of either key alone
--         never lets a spent token buy again); trimmed of expired tokens at each spend.
--         Optional (a caller of the version before passes only KEYS[1]).
-- ARGV[1] "take" | "spend" | "give" | "undo" (give back an attempt that never reached the
--         backend: it does not count) | "renew"
-- ARGV[2] the purchase attempt's id, ARGV[3] the key's TTL (ms: until the token has expired on
--         every instance), ARGV[4] the lease (ms), ARGV[5] max attempts, ARGV[6] the token id
--         (the member of KEYS[2])
-- Reply: take: {"TAKEN", attempts} | {"SPENT", attempts} | {"IN_FLIGHT", attempts}
--        | {"EXHAUSTED", attempts}; the others: 1 when they changed the claim, else 0.
--        A take by the attempt that already holds the pending claim (a retried call whose
--        first reply was lost) is TAKEN again, not a second use.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op, owner = ARGV[1], ARGV[2]
local ttl, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
local kind = redis.call('TYPE', KEYS[1])['ok']
local spent_elsewhere = KEYS[2] and redis.call('ZSCORE', KEYS[2], ARGV[6] or '') and true

if kind == 'string' then
  if op == 'take' then return {'SPENT', 1} end
  return 0
end
local h = redis.call('HMGET', KEYS[1], 'state', 'owner', 'attempts', 'lease')
local state, holder = h[1], h[2]
local attempts = tonumber(h[3] or '0')
local live = state == 'pending' and tonumber(h[4] or '0') > now

if op == 'take' then
  if state == 'spent' or spent_elsewhere then return {'SPENT', math.max(attempts, 1)} end
  if live then
    if holder == owner then
      redis.call('HSET', KEYS[1], 'lease', now + lease)
      return {'TAKEN', attempts}
    end
    return {'IN_FLIGHT', attempts}
  end
  -- Never taken, given back, or pending under a lease that lapsed (its replica died).
  if attempts >= tonumber(ARGV[5]) then return {'EXHAUSTED', attempts} end
  redis.call('HSET', KEYS[1], 'state', 'pending', 'owner', owner, 'attempts', attempts + 1,
    'lease', now + lease)
  if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
  return {'TAKEN', attempts + 1}
end

if op == 'spend' then
  -- The purchase went through: spent, whoever holds the claim now (a lease that lapsed meanwhile
  -- must not leave the token usable), and also where the claim was lost with Redis' data.
  redis.call('HSET', KEYS[1], 'state', 'spent', 'owner', owner)
  redis.call('HDEL', KEYS[1], 'lease')
  if attempts == 0 then redis.call('HSET', KEYS[1], 'attempts', 1) end
  if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
  if KEYS[2] then
    redis.call('ZADD', KEYS[2], 'GT', now + ttl, ARGV[6])
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
    if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
  end
  return 1
end

-- give, undo and renew act only on this attempt's own pending claim.
if state ~= 'pending' or holder ~= owner then return 0 end
if op == 'renew' then
  if not live then return 0 end
  redis.call('HSET', KEYS[1], 'lease', now + lease)
  return 1
end
if op == 'undo' then attempts = math.max(0, attempts - 1) end
redis.call('HSET', KEYS[1], 'state', 'free', 'attempts', attempts)
redis.call('HDEL', KEYS[1], 'lease')
return 1
