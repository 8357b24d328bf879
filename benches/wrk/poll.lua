-- wrk: GET poll for random users of the hot target (most of them entered by the enter run).
math.randomseed(os.time() + 1)
request = function()
  local user = math.random(1, 1000000)
  return wrk.format("GET", "/virtual-queues/limited-drop/42/entries/me",
    { ["X-User-Id"] = tostring(user) }, nil)
end
