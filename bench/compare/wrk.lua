-- wrk script for bench/compare.sh: every request carries an X-Api-Key drawn at random from KEYS
-- keys (environment, default 10000; KEYS=1 is one hot key). The same script drives every
-- contender, so the client's own cost is the same in every column. Requests are formatted once
-- per thread in init(), not per request.
--
-- done() prints one machine-readable line (latencies in µs, as wrk records them), as
-- bench/latency.lua does for bench/outage_latency.sh.

local n = tonumber(os.getenv("KEYS") or "10000") or 10000
local requests = {}

function init(args)
  for i = 1, n do
    requests[i] = wrk.format(nil, nil, { ["X-Api-Key"] = "k" .. i })
  end
end

function request()
  return requests[math.random(n)]
end

function done(summary, latency, reqs)
  local seconds = summary.duration / 1e6
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d rps=%.0f p50_us=%d p99_us=%d max_us=%d non2xx=%d socket_errors=%d\n",
    summary.requests, summary.requests / seconds,
    latency:percentile(50), latency:percentile(99), latency.max,
    e.status, e.connect + e.read + e.write + e.timeout))
end
