#!lua
-- open.lua: the cap on open queues (`queue.max_active_targets`), exact under concurrency. A
-- target may open a queue if it has one (is in queue:active) or there is room, in which case it
-- is added in the same step: concurrent first enters of many new targets cannot overshoot.
-- queue:active only lists targets with waiting users; the pump retires empty ones, so an idle or
-- made-up target stops counting.
--
-- KEYS[1] queue:active  SET of "TYPE:ID"; a key of its own (own slot)
-- ARGV[1] target "TYPE:ID", ARGV[2] cap
-- Reply: 1 open (a member now), 0 refused (the cap is reached)

if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then
  return 1
end
if redis.call('SCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('SADD', KEYS[1], ARGV[1])
  return 1
end
return 0
