-- wrk script: a ~1 KB chat completion request (GW_BENCH_PROMPT_BYTES sets the user message's
-- size), the same shape for every target, with a new prompt each time (the run's id from
-- GW_BENCH_RUN, which benches/load/run makes new for every wrk run, and a counter) so that the
-- gateway's cache takes its miss path, also in the runs after the first.
-- The gateway headers are read by the gateway and ignored by the mock and the bare proxy.
local sentence = "The quick brown fox jumps over the lazy dog. "
local prompt_bytes = tonumber(os.getenv("GW_BENCH_PROMPT_BYTES") or "") or 900
local content = string.rep(sentence, math.max(1, math.ceil(prompt_bytes / #sentence)))
local counter = 0
local run = os.getenv("GW_BENCH_RUN") or tostring(os.time())
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-gw-provider"] = "@mock"
wrk.headers["x-gw-api-key"] = os.getenv("GW_BENCH_KEY") or ""
local head = '{"model":"gpt-bench","temperature":0.7,"messages":[' ..
  '{"role":"system","content":"You are a benchmark."},' ..
  '{"role":"user","content":"' .. content
local tail = '"}]}'

request = function()
  counter = counter + 1
  return wrk.format(nil, nil, nil, head .. run .. "-" .. counter .. tail)
end
