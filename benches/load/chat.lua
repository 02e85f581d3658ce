-- wrk script: a ~1 KB chat completion request, the same for every target.
-- The provider header is read by the gateway and ignored by the mock and the bare proxy.
local content = string.rep("The quick brown fox jumps over the lazy dog. ", 20)
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-gw-provider"] = "@mock"
wrk.body = '{"model":"gpt-bench","temperature":0.7,"messages":[' ..
  '{"role":"system","content":"You are a benchmark."},' ..
  '{"role":"user","content":"' .. content .. '"}]}'
