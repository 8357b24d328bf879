-- wrk: POST enter for random users of one hot target (a sale-start spike).
math.randomseed(os.time())
request = function()
  local user = math.random(1, 1000000)
  return wrk.format("POST", "/virtual-queues/limited-drop/42/entries",
    { ["X-User-Id"] = tostring(user), ["Content-Length"] = "0" }, "")
end
