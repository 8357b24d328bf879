-- wrk: POST enter for random users 1..100000 of one hot target: first entries, then more and
-- more idempotent re-entries (the same script path answers both).
math.randomseed(os.time())
request = function()
  local user = math.random(1, 100000)
  return wrk.format("POST", "/virtual-queues/limited-drop/42/entries",
    { ["X-User-Id"] = tostring(user), ["Content-Length"] = "0" }, "")
end
