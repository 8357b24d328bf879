#!lua flags=allow-oom
-- paced.lua: writes back an admission a replica made while its store could not be used (paced
-- fail-open, docs/state.md): the user's token becomes the stored one, and the user leaves
-- the waiting room, so the pump never admits the same user a second time and every later poll
-- answers that same token. Atomic and idempotent: a token already stored wins (the user was
-- admitted through the store meanwhile, and that is the one answered from now on).
--
-- KEYS[1] queue:{T}:waiting, KEYS[2] queue:{T}:queued, KEYS[3] queue:{T}:token:{userId}
-- ARGV[1] userId, ARGV[2] "expiresAt|token", ARGV[3] the token's remaining lifetime (s)
-- Reply: 1 when written, 0 when a token was stored already
--
-- `allow-oom`: a paced admission that cannot be recorded would be admitted again.

local stored = redis.call('GET', KEYS[3])
if stored then
  return 0
end
redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[3])
local seq = redis.call('ZSCORE', KEYS[1], ARGV[1])
if seq then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('SETBIT', KEYS[2], seq, 0)
end
return 1
