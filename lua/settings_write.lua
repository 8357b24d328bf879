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
--                             intact (its size as recorded); over a document lost under a newer
--                             version, at that version + 1
--   "bootstrap"               the first creation: hash fields set where missing, version 1;
--                             nothing when the meta hash exists
-- ARGV[3] set/add/remove: the writer's clock (epoch ms); restore: the version written back
-- ARGV[4] set/add/remove: "1" when the document may be created (no replica runs that could
--         write back a lost one); otherwise a missing document is refused
-- ARGV[5..] the items: field, value pairs (hash) or members (set)
-- The meta hash also records `count`, the document's number of fields or members after the
-- write: settings_read.lua takes a document whose count differs (deleted with its meta kept, a
-- field removed by hand) for a loss, which replicas write back, never for an operator's
-- decision (the operator's way is `vq-gateway flag set` / `target`).
-- Reply: {status, version}: "ok" (written; the version now), "newer" (restore or bootstrap:
--        nothing written; the version Redis holds), "missing" (set/add/remove: the document and
--        its version are gone and replicas run that will write it back: nothing written)

local doc, meta = KEYS[1], KEYS[2]
local is_hash = ARGV[1] == 'hash'
local op = ARGV[2]
local arg = tonumber(ARGV[3]) or 0
local stored = tonumber(redis.call('HGET', meta, 'version'))

local function count()
  if is_hash then
    return redis.call('HLEN', doc)
  end
  return redis.call('SCARD', doc)
end

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
  -- A document whose size is not what its last write recorded was lost under its meta: the
  -- write-back replaces it even at the same version.
  local recorded = tonumber(redis.call('HGET', meta, 'count'))
  local intact = not recorded or recorded == count()
  if stored and stored >= arg and intact then
    return {'newer', stored}
  end
  -- Lost under a newer version than the writer knows (a change it had not read yet): what it
  -- knows is written back above that version, so every replica adopts it; the change is lost
  -- with the document either way.
  local version = math.max(arg, (stored or 0) + (intact and 0 or 1))
  write(5, true)
  redis.call('HSET', meta, 'version', version, 'count', count())
  return {'ok', version}
elseif op == 'bootstrap' then
  if stored then
    return {'newer', stored}
  end
  write(5, false)
  redis.call('HSET', meta, 'version', 1, 'count', count())
  return {'ok', 1}
end

-- An operator's change.
if not stored and redis.call('EXISTS', doc) == 0 and ARGV[4] ~= '1' then
  return {'missing', 0}
end
-- A change that changes nothing (a member added again, a field set to its value) keeps the
-- version: replicas have nothing new to read, and a loss right after it is still theirs to write
-- back.
local same = stored ~= nil
for i = 5, (is_hash and #ARGV - 1 or #ARGV), (is_hash and 2 or 1) do
  if is_hash then
    same = same and redis.call('HGET', doc, ARGV[i]) == ARGV[i + 1]
  else
    local member = redis.call('SISMEMBER', doc, ARGV[i]) == 1
    same = same and (member == (op ~= 'remove'))
  end
end
if same and tonumber(redis.call('HGET', meta, 'count')) == count() then
  return {'ok', stored}
end
write(5, false)
local version = math.max((stored or 0) + 1, arg)
redis.call('HSET', meta, 'version', version, 'count', count())
return {'ok', version}
