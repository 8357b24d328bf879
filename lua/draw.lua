#!lua flags=allow-oom
-- draw.lua: the pre-queue's draw at a sale's opening (src/draw.rs has the algorithm; the pump
-- computes the order from the seed, which needs SHA-256). Two steps, each atomic:
--   "prepare": at or after opensAt, before the draw: closes the pre-queue (drawSeq: the current
--     seq; every later enter gets a larger one and queues behind) and answers the entrants (the
--     users waiting with a seq up to drawSeq) and the seed.
--   "apply": gives each entrant its new seq, if the entrants are exactly the users still waiting
--     with a seq up to drawSeq (none left, none evicted meanwhile; else nothing is written and
--     the pump starts over at its next visit). The set of seqs does not change (the entrants
--     exchange theirs), so the queued bitmap stays right; heartbeats are kept by seq, so the
--     sale's windows restart (windowSince). Records drawnAt, drawEntrants and the order.
--
-- KEYS[1] queue:{T}:waiting, KEYS[2] queue:{T}:seq, KEYS[3] queue:{T}:sale,
-- KEYS[4] queue:{T}:draw  LIST: the draw's order (user ids, first admitted first)
-- ARGV[1] "prepare" | "apply", ARGV[2] now (ms); apply: ARGV[3] drawSeq, ARGV[4] the seed (hex)
-- the caller drew with, revealed in drawSeed; ARGV[5..] user, seq pairs in the draw's order
-- Reply: prepare: {"NOT_YET"} | {"DRAWN"} | {"ENTRANTS", drawSeq, seed (a sale of an older
--        version stored it; else ""), nonce, commitment, user, seq, ...};
--        apply: {"APPLIED"} | {"STALE"} | {"DRAWN"}

local call, mode, now = redis.call, ARGV[1], tonumber(ARGV[2])
local sale = call('HMGET', KEYS[3], 'opensAt', 'drawnAt', 'drawSeq', 'drawSeed', 'drawNonce',
  'drawCommitment')
local opens_at = tonumber(sale[1] or '0')
if tonumber(sale[2] or '0') > 0 then
  return {'DRAWN'}
end
if opens_at == 0 or now < opens_at then
  return {'NOT_YET'}
end

if mode == 'prepare' then
  local draw_seq = tonumber(sale[3] or '0')
  if draw_seq == 0 then
    draw_seq = tonumber(call('GET', KEYS[2]) or '0')
    call('HSET', KEYS[3], 'drawSeq', string.format('%d', draw_seq))
  end
  local out = {'ENTRANTS', string.format('%d', draw_seq), sale[4] or '', sale[5] or '',
    sale[6] or ''}
  local entrants = call('ZRANGEBYSCORE', KEYS[1], '-inf', draw_seq, 'WITHSCORES')
  for i = 1, #entrants do
    out[#out + 1] = entrants[i]
  end
  return out
end

-- apply
local draw_seq = ARGV[3]
if tostring(sale[3]) ~= draw_seq then
  return {'STALE'}
end
local n = (#ARGV - 4) / 2
if call('ZCOUNT', KEYS[1], '-inf', draw_seq) ~= n then
  return {'STALE'}
end
local users = {}
for i = 1, n do
  local user = ARGV[3 + 2 * i]
  local seq = call('ZSCORE', KEYS[1], user)
  if not seq or tonumber(seq) > tonumber(draw_seq) then
    return {'STALE'}
  end
  users[i] = user
end
for i = 1, n do
  call('ZADD', KEYS[1], ARGV[4 + 2 * i], users[i])
end
call('DEL', KEYS[4])
for from = 1, n, 1000 do
  call('RPUSH', KEYS[4], unpack(users, from, math.min(n, from + 999)))
end
call('HSET', KEYS[3], 'drawnAt', ARGV[2], 'drawEntrants', string.format('%d', n),
  'windowSince', ARGV[2], 'drawSeed', ARGV[4])
return {'APPLIED'}
