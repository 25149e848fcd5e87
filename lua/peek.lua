-- peek.lua: one bucket as token_bucket.lua would read it now, without writing anything (the admin
-- API's GET /v1/buckets). Either format is read, as the decision script reads both.
--
-- KEYS[1]  the bucket
-- ARGV[1]  now, in microseconds since the Unix epoch; "" means "use Redis TIME"
--
-- Reply, as strings (integers up to 2^53, exact): { found, v, t, s, pttl_ms, now }
--   found    "1" when the key holds a bucket, "0" when it does not (none: a full bucket; or
--            something that is not one, which the decision script would reset to full)
--   v, t, s  the stored state: units held, the microsecond they were computed for, their scale
--            ("0": a hash written before s existed, read in the limit's scale)
--   pttl_ms  the key's PTTL (negative: no key, or no expiry)
--
-- By hand:  redis-cli --eval lua/peek.lua 'rl:{demo}:l' , ""

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

local key = KEYS[1]
local kind = redis.call('TYPE', key)['ok']
local v, t, s
if kind == 'string' then
  local raw = redis.call('GET', key)
  if #raw == 24 then
    v, t, s = struct.unpack('<ddd', raw)
  end
elseif kind == 'hash' then
  local h = redis.call('HMGET', key, 'v', 't', 's')
  v, t, s = tonumber(h[1]), tonumber(h[2]), tonumber(h[3] or '0')
end

local function int(x)
  return string.format('%d', x)
end

local pttl = redis.call('PTTL', key)
if v == nil or t == nil or v < 0 or t < 0 or v % 1 ~= 0 or t % 1 ~= 0 then
  return { '0', '0', '0', '0', int(pttl), int(now) }
end
return { '1', int(v), int(t), int(s or 0), int(pttl), int(now) }
