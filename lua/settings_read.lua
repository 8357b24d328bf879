#!lua flags=no-writes,allow-oom
-- settings_read.lua: one run-time settings document (`src/settings.rs`) with its version, read
-- together so a document and the version beside it always belong to the same write.
--
-- KEYS[1] the document: queue:flag (HASH) or queue:targets (SET)
-- KEYS[2] its meta hash ({queue:flag}:meta, same slot): field `version`
-- ARGV[1] "hash" | "set"
-- Reply: {version, or -1 when the meta hash is missing or the document's size differs from the
--         `count` the last write recorded (deleted with its meta kept, a field removed by hand:
--         lost, not decided); then the hash's field, value pairs or the set's members}

local meta = redis.call('HMGET', KEYS[2], 'version', 'count')
local version = meta[1]
local items
if ARGV[1] == 'hash' then
  items = redis.call('HGETALL', KEYS[1])
else
  items = redis.call('SMEMBERS', KEYS[1])
end
local reply = {tonumber(version) or -1}
if meta[2] and tonumber(meta[2]) ~= #items / (ARGV[1] == 'hash' and 2 or 1) then
  reply[1] = -1
end
for i = 1, #items do
  reply[#reply + 1] = items[i]
end
return reply
