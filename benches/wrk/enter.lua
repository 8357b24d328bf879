-- wrk: POST enter for random users 1..100000 of one hot target: first entries, then more and
-- more idempotent re-entries (the same script path answers both).
-- Each wrk thread has its own Lua state: seed each one differently, or they draw the same users.
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
function init(args)
  math.randomseed(os.time() * 16 + id)
end
request = function()
  local user = math.random(1, 100000)
  return wrk.format("POST", "/virtual-queues/limited-drop/42/entries",
    { ["X-User-Id"] = tostring(user), ["Content-Length"] = "0" }, "")
end
