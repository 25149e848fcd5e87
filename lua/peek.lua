-- peek.lua: one bucket as token_bucket.lua would read it now, without writing anything (the admin
-- API's GET /v1/buckets). Every format is read, as the decision script reads them all.
--
-- KEYS[1]  the bucket
-- ARGV[1]  now, in microseconds since the Unix epoch; "" means "use Redis TIME"
--
-- Reply, as strings (integers up to 2^53, exact): { found, v, t, s, pttl_ms, now }
--   found    "1" when the key holds a bucket, "0" when it does not (none: a full bucket; or
--            something token_bucket.lua would call bad and reset to full: another type, fields
--            that are not whole numbers in 0..2^53, a scale of 0)
--   v, t, s  the stored state: units held, the microsecond they were computed for, their scale
--            ("0": a hash written before s existed, read in the limit's scale)
--   pttl_ms  the key's PTTL (negative: no key, or no expiry)
-- A concurrency limit's sorted set of leases answers found "2" and, as v, the leases that have
-- not expired at now (t = now, s = 1).
--
-- By hand:  redis-cli --eval lua/peek.lua 'rl:{demo}:l' , ""

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

local key = KEYS[1]

-- A whole number in 0..2^53, or nil: what a field written by token_bucket.lua holds.
local function whole(x)
  local n = tonumber(x)
  if n ~= nil and n >= 0 and n <= 9007199254740992 and n % 1 == 0 then
    return n
  end
  return nil
end

-- Read as token_bucket.lua reads it: anything it would call bad (and reset to full) is no bucket.
local kind = redis.call('TYPE', key)['ok']
local v, t, s, ok
if kind == 'string' then
  local raw = redis.call('GET', key)
  -- packed (24 bytes), or packed_ttl (32: a fourth number, the instant the expiry covers).
  if #raw == 24 or #raw == 32 then
    local a, b, c, e = struct.unpack(#raw == 24 and '<ddd' or '<dddd', raw)
    v, t, s = whole(a), whole(b), whole(c)
    ok = v ~= nil and t ~= nil and s ~= nil and s > 0 and (e == nil or whole(e) ~= nil)
  end
elseif kind == 'hash' then
  local h = redis.call('HMGET', key, 'v', 't', 's')
  v, t = whole(h[1]), whole(h[2])
  if h[3] then
    s = whole(h[3])
    ok = v ~= nil and t ~= nil and s ~= nil and s > 0
  else
    -- Written before `s` existed: in the limit's own scale.
    s = 0
    ok = v ~= nil and t ~= nil
  end
end

local function int(x)
  return string.format('%d', x)
end

local pttl = redis.call('PTTL', key)
if kind == 'zset' then
  local live = redis.call('ZCOUNT', key, '(' .. int(now), '+inf')
  return { '2', int(live), int(now), '1', int(pttl), int(now) }
end
if not ok then
  return { '0', '0', '0', '0', int(pttl), int(now) }
end
return { '1', int(v), int(t), int(s), int(pttl), int(now) }
