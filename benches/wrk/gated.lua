-- wrk: POST to the gated purchase route with a valid entry token (TOKEN env var, user 1001).
local token = os.getenv("TOKEN")
wrk.method = "POST"
wrk.body = '{"quantity":1}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-User-Id"] = "1001"
wrk.headers["X-Entry-Token"] = token
