-- renew.lua: keeps a concurrency lease alive while its request is still in flight (a long
-- stream outlives lease_ms, which only has to outlast a proxy that died holding it).
--
-- KEYS[1]  the limit's sorted set of leases
-- ARGV[1]  now, in microseconds since the Unix epoch; "" means "use Redis TIME"
-- ARGV[2]  lease_ms
-- ARGV[3]  the lease id
--
-- Reply: 1 when the lease was still there and now expires lease_ms from now, 0 when it was not
-- (it expired: it is not taken back, its place may be another request's by now).
--
-- By hand:  redis-cli --eval lua/renew.lua 'rl:{api:k}:inflight@inflight' , "" 30000 42

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
local key, ms, id = KEYS[1], tonumber(ARGV[2]), ARGV[3]
if redis.call('TYPE', key).ok ~= 'zset' or not redis.call('ZSCORE', key, id) then
  return 0
end
redis.call('ZADD', key, now + ms * 1000, id)
-- Only ever longer, as token_bucket.lua sets it.
if redis.call('PTTL', key) < ms + 1000 then
  redis.call('PEXPIRE', key, ms + 1000)
end
return 1
