-- wrk: GET poll for random users of the hot target; the enter runs before it have entered nearly
-- all of users 1..100000, so polls answer WAITING (run.sh reports the non-200 count).
math.randomseed(os.time() + 1)
request = function()
  local user = math.random(1, 100000)
  return wrk.format("GET", "/virtual-queues/limited-drop/42/entries/me",
    { ["X-User-Id"] = tostring(user) }, nil)
end
