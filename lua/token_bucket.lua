-- token_bucket.lua: atomic, all-or-nothing token-bucket decisions for the limits of one request or
-- of a batch of requests, decided one after the other in the order given.
--
-- A batch is what one proxy collected while its previous call was in flight: one call instead of
-- many divides Redis's cost per call (parsing, the script's setup, the reply, the syscalls) by the
-- batch's size. Each request is still all-or-nothing over its own buckets, and a later request
-- sees what an earlier one took, exactly as if each had been its own call at the same instant.
--
-- ARGV[1]  now, in microseconds since the Unix epoch; "" means "use Redis TIME" (no skew between
--          proxies). One instant for the whole batch: it left one proxy at one moment.
-- Then, for each request in turn:
--          n         how many limits it has; its buckets are the next n KEYS
--          and for each of its limits:
--          capacity  whole tokens the bucket holds (the burst)
--          scale     units per token
--          num       units the bucket gains per microsecond (the rate is num/scale tokens per µs)
--          cost      whole tokens this request takes
-- KEYS     every request's buckets, in order. On a Redis Cluster all of them share one slot.
--
-- Reply: for each request in turn { allowed, then for each of its limits: held, lag_us, bad },
-- one flat list of integers:
--   allowed    1 when every bucket had `cost` tokens and all were taken, 0 when none was taken
--   held       units the bucket holds: after this request when allowed, refilled but untouched when not
--   lag_us     how far the bucket's instant is ahead of `now` (0 unless another proxy's clock runs
--              ahead): it refills from now + lag_us on
--   bad        1 when the key held something that is not a bucket (another type, missing or
--              non-numeric fields): it was deleted and read as a full bucket, so it is limited again
-- The caller derives what clients see (remaining, reset, retry) from `held` with the same
-- arithmetic as the in-memory store (src/limiter/bucket.rs), so the two cannot disagree.
--
-- State: a hash per bucket, v = units held, t = the microsecond v was computed for, s = the scale v
-- is in. Units are exact integers: refill adds (elapsed µs × num) units, so no rounding is ever
-- carried or lost, and the caller keeps capacity × scale + num within 2^53 so that Lua's doubles
-- stay exact. When a reload changed the limit, the tokens held carry over (converted to the new
-- scale, rounded down) and never exceed the new capacity.
--
-- By hand:  redis-cli --eval lua/token_bucket.lua rl:{demo}:l , "" 1 3 1000000 1 1
--           (one request with one limit: capacity 3, one token per second, cost 1)

-- held × to / from, rounded down, exactly. held × to can pass 2^53, where doubles round; so the
-- fraction is reduced by its gcd (a/b) and held split by b: held × a / b = q × a + r × a / b with
-- r < b, every step an exact integer as long as a × b < 2^53, which rates of the form
-- "<number>/<unit>" always give in practice (their scales share most factors of 2, 3 and 5).
local function rescale(held, from, to)
  local x, y = to, from
  while y > 0 do
    x, y = y, x % y
  end
  local a, b = to / x, from / x
  local q = math.floor(held / b)
  local r = held - q * b
  return q * a + math.floor(r * a / b)
end

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

-- A whole number in 0..2^53, or nil: what a field written by this script holds.
local function whole(x)
  local n = tonumber(x)
  if n ~= nil and n >= 0 and n <= 9007199254740992 and n == math.floor(n) then
    return n
  end
  return nil
end

-- The bucket at `key` refilled up to now: units held, its instant, and 1 when the key held
-- something that is not a bucket (it is deleted and read as a full bucket, so limited again).
local function refill(key, cap, scale, num)
  -- pcall: a key of another type answers WRONGTYPE, which must heal the key, not fail every
  -- decision of this client forever.
  local state = redis.pcall('HMGET', key, 'v', 't', 's')
  local held, at, was
  local bad = 0
  if state.err then
    bad = 1
  elseif not state[1] and not state[2] and not state[3] then
    -- No bucket here: a new client, or a hash of something else (checked only then).
    if redis.call('EXISTS', key) == 1 then
      bad = 1
    end
  else
    held, at, was = whole(state[1]), whole(state[2]), whole(state[3])
    if held == nil or at == nil or (state[3] and (was == nil or was == 0)) then
      bad = 1
    end
  end
  if bad == 1 then
    redis.call('DEL', key)
    held, at, was = nil, nil, nil
  end
  if held == nil then
    held, at = cap, now
  elseif was ~= nil and was ~= scale then
    held = rescale(held, was, scale)
  end
  if held > cap then
    held = cap
  end
  -- A clock that reads earlier than the stored instant (another proxy's clock) refills nothing and
  -- never moves t backwards, so skew cannot credit the same interval twice.
  if now > at then
    local missing = cap - held
    if missing > 0 then
      local elapsed = now - at
      if elapsed * num >= missing then
        held = cap
      else
        held = held + elapsed * num
      end
    end
    at = now
  end
  return held, at, bad
end

local reply = {}
local k, a = 0, 2
local v, t, cap, scale, num, cost, bad = {}, {}, {}, {}, {}, {}, {}
while a <= #ARGV do
  local n = tonumber(ARGV[a])
  a = a + 1
  local allowed = 1
  for i = 1, n do
    scale[i] = tonumber(ARGV[a + 1])
    cap[i] = tonumber(ARGV[a]) * scale[i]
    num[i] = tonumber(ARGV[a + 2])
    cost[i] = tonumber(ARGV[a + 3]) * scale[i]
    a = a + 4
    v[i], t[i], bad[i] = refill(KEYS[k + i], cap[i], scale[i], num[i])
    if v[i] < cost[i] then
      allowed = 0
    end
  end
  reply[#reply + 1] = allowed
  for i = 1, n do
    local key = KEYS[k + i]
    if allowed == 1 then
      v[i] = v[i] - cost[i]
      local fill_us = math.ceil((cap[i] - v[i]) / num[i])
      -- Expire no earlier than the bucket would be full again: a key that vanishes early reads as
      -- a full bucket, which is over-admission. The second of margin covers proxy-clock skew.
      redis.call('HSET', key, 'v', string.format('%.0f', v[i]), 't', string.format('%.0f', t[i]), 's', scale[i])
      redis.call('PEXPIRE', key, math.ceil(fill_us / 1000) + 1000)
    end
    reply[#reply + 1] = v[i]
    reply[#reply + 1] = t[i] - now
    reply[#reply + 1] = bad[i]
  end
  k = k + n
end
return reply
