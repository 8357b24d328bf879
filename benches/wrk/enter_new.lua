-- wrk: POST enter for users who never entered before (each request a new user id), one hot
-- target: the first-entry path of a sale's spike, which the random-user script reaches only at
-- the start. Ids are distinct per wrk thread and per run (the run's start time is in them).
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
local base, n = 0, 0
function init(args)
  base = ((os.time() % 1000000) * 16 + id) * 10000000
end
request = function()
  n = n + 1
  return wrk.format("POST", "/virtual-queues/limited-drop/42/entries",
    { ["X-User-Id"] = tostring(base + n), ["Content-Length"] = "0" }, "")
end
