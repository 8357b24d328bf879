#!lua
-- settings_write.lua: every write of a run-time settings document (`src/settings.rs`): the
-- operator's changes (`vq-gateway flag set`, `target add|remove`), a replica's write-back of a
-- document Redis lost, and the first creation from a replica's TOML values. Atomic, so the
-- document and its version never disagree; without allow-oom, so a full Redis refuses the whole
-- write rather than half of it.
--
-- KEYS[1] the document: queue:flag (HASH) or queue:targets (SET)
-- KEYS[2] its meta hash ({queue:flag}:meta, same slot): field `version`
-- ARGV[1] "hash" | "set"
-- ARGV[2] the operation:
--   "set" | "add" | "remove"  an operator's change: hash fields set / set members added / set
--                             members removed; the version becomes max(version + 1, ARGV[3])
--   "restore"                 a replica's write-back: the document is replaced by the items,
--                             at version ARGV[3], unless Redis holds that version or a newer one
--   "bootstrap"               the first creation: hash fields set where missing, version 1;
--                             nothing when the meta hash exists
-- ARGV[3] set/add/remove: the writer's clock (epoch ms); restore: the version written back
-- ARGV[4] set/add/remove: "1" when the document may be created (no replica runs that could
--         write back a lost one); otherwise a missing document is refused
-- ARGV[5..] the items: field, value pairs (hash) or members (set)
-- Reply: {status, version}: "ok" (written; the version now), "newer" (restore or bootstrap:
--        nothing written; the version Redis holds), "missing" (set/add/remove: the document and
--        its version are gone and replicas run that will write it back: nothing written)

local doc, meta = KEYS[1], KEYS[2]
local is_hash = ARGV[1] == 'hash'
local op = ARGV[2]
local arg = tonumber(ARGV[3]) or 0
local stored = tonumber(redis.call('HGET', meta, 'version'))

local function write(items_from, replace)
  if replace then
    redis.call('DEL', doc)
  end
  if is_hash then
    for i = items_from, #ARGV - 1, 2 do
      if replace or op == 'set' then
        redis.call('HSET', doc, ARGV[i], ARGV[i + 1])
      else
        redis.call('HSETNX', doc, ARGV[i], ARGV[i + 1])
      end
    end
  else
    for i = items_from, #ARGV do
      if op == 'remove' then
        redis.call('SREM', doc, ARGV[i])
      else
        redis.call('SADD', doc, ARGV[i])
      end
    end
  end
end

if op == 'restore' then
  if stored and stored >= arg then
    return {'newer', stored}
  end
  write(5, true)
  redis.call('HSET', meta, 'version', arg)
  return {'ok', arg}
elseif op == 'bootstrap' then
  if stored then
    return {'newer', stored}
  end
  write(5, false)
  redis.call('HSET', meta, 'version', 1)
  return {'ok', 1}
end

-- An operator's change.
if not stored and redis.call('EXISTS', doc) == 0 and ARGV[4] ~= '1' then
  return {'missing', 0}
end
write(5, false)
local version = math.max((stored or 0) + 1, arg)
redis.call('HSET', meta, 'version', version)
return {'ok', version}
