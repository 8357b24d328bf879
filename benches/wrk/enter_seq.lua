-- wrk: POST enter for users 1..100000 in order (each thread its own stride), then around again:
-- fills the waiting room that benches/wrk/poll.lua polls.
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
local n = 0
function init(args)
  n = id - 1
end
request = function()
  n = n + 2
  local user = (n % 100000) + 1
  return wrk.format("POST", "/virtual-queues/limited-drop/42/entries",
    { ["X-User-Id"] = tostring(user), ["Content-Length"] = "0" }, "")
end
