-- wrk script for bench/outage_latency.sh: one machine-readable line per run, so the driver needs
-- no parsing of wrk's human summary (which rounds to two significant digits and hides p99.9).
--
-- Latencies are in microseconds, as wrk records them. wrk is closed-loop: a connection sends its
-- next request only when the previous one is answered, so a stall is recorded once per connection
-- rather than once per request that would have arrived during it (coordinated omission).

-- THINK_MS > 0: each connection waits that long between a response and its next request, which
-- keeps the load below saturation (latency then measures service time rather than CPU queueing).
-- wrk only paces when a function named delay exists, so it is defined only then.
local think = tonumber(os.getenv("THINK_MS") or "0") or 0
if think > 0 then
   delay = function() return think end
end

done = function(summary, latency, requests)
   local seconds = summary.duration / 1e6
   local e = summary.errors
   io.write(string.format(
      "RESULT requests=%d rps=%.0f p50_us=%d p99_us=%d p999_us=%d max_us=%d non2xx=%d socket_errors=%d\n",
      summary.requests, summary.requests / seconds,
      latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max,
      -- wrk's "Non-2xx or 3xx responses": every status >= 400.
      e.status,
      e.connect + e.read + e.write + e.timeout))
end
