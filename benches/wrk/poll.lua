-- wrk: GET poll for random users 1..100000 of the hot target; the enter runs before it have
-- entered most of them (run.sh reports the non-200 count: 404 for users never drawn).
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
function init(args)
  math.randomseed(os.time() * 16 + 8 + id)
end
request = function()
  local user = math.random(1, 100000)
  return wrk.format("GET", "/virtual-queues/limited-drop/42/entries/me",
    { ["X-User-Id"] = tostring(user) }, nil)
end
