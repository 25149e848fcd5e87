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
-- ARGV[2]  m, how many distinct limits the batch's requests draw on (most batches: one per route
--          seen), then for each of them, 1 to m:
--          capacity  whole tokens the bucket holds (the burst)
--          scale     units per token
--          num       units the bucket gains per microsecond (the rate is num/scale tokens per µs)
--          cost      whole tokens a request takes
-- Then, for each request in turn:
--          n         how many limits it has; its buckets are the next n KEYS
--          and n limit numbers (1 to m), one per bucket
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
-- By hand:  redis-cli --eval lua/token_bucket.lua rl:{demo}:l , "" 1 3 1000000 1 1 1 1
--           (one limit: capacity 3, one token per second, cost 1; one request drawing on it)

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
  if n ~= nil and n >= 0 and n <= 9007199254740992 and n % 1 == 0 then
    return n
  end
  return nil
end

-- The limits, in units: read once per batch, however many requests draw on them.
local m = tonumber(ARGV[2])
local cap, scale, scale_text, num, cost = {}, {}, {}, {}, {}
for j = 1, m do
  local a = 3 + 4 * (j - 1)
  scale_text[j] = ARGV[a + 1]
  scale[j] = tonumber(ARGV[a + 1])
  cap[j] = tonumber(ARGV[a]) * scale[j]
  num[j] = tonumber(ARGV[a + 2])
  cost[j] = tonumber(ARGV[a + 3]) * scale[j]
end

-- The bucket at `key` refilled up to now under limit j: units held, its instant, 1 when the key
-- held something that is not a bucket (it is deleted and read as a full bucket, so limited
-- again), and whether its stored scale is limit j's (else a write must store it).
local function refill(key, j)
  -- pcall: a key of another type answers WRONGTYPE, which must heal the key, not fail every
  -- decision of this client forever.
  local state = redis.pcall('HMGET', key, 'v', 't', 's')
  local held, at
  local bad, same_scale = 0, false
  if state.err then
    bad = 1
  elseif not state[1] and not state[2] and not state[3] then
    -- No bucket here: a new client, or a hash of something else (checked only then).
    if redis.call('EXISTS', key) == 1 then
      bad = 1
    end
  else
    held, at = whole(state[1]), whole(state[2])
    if held == nil or at == nil then
      bad = 1
    elseif state[3] == scale_text[j] or not state[3] then
      -- The common case: a string comparison, no conversion. No `s` at all: written in this
      -- scale by a version that stored none.
      same_scale = state[3] ~= nil
    else
      local was = whole(state[3])
      if was == nil or was == 0 then
        bad = 1
      elseif was ~= scale[j] then
        held = rescale(held, was, scale[j])
      else
        same_scale = true
      end
    end
  end
  if bad == 1 then
    redis.call('DEL', key)
    held = nil
  end
  if held == nil then
    held, at = cap[j], now
  end
  if held > cap[j] then
    held = cap[j]
  end
  -- A clock that reads earlier than the stored instant (another proxy's clock) refills nothing and
  -- never moves t backwards, so skew cannot credit the same interval twice.
  if now > at then
    local missing = cap[j] - held
    if missing > 0 then
      local gained = (now - at) * num[j]
      if gained >= missing then
        held = cap[j]
      else
        held = held + gained
      end
    end
    at = now
  end
  return held, at, bad, same_scale
end

local reply = {}
local r = 0
local k = 0
local a = 3 + 4 * m
local v, t, bad, same, lim = {}, {}, {}, {}, {}
while a <= #ARGV do
  local n = tonumber(ARGV[a])
  local allowed = 1
  for i = 1, n do
    local j = tonumber(ARGV[a + i])
    lim[i] = j
    v[i], t[i], bad[i], same[i] = refill(KEYS[k + i], j)
    if v[i] < cost[j] then
      allowed = 0
    end
  end
  a = a + 1 + n
  r = r + 1
  reply[r] = allowed
  for i = 1, n do
    local j = lim[i]
    if allowed == 1 then
      local key = KEYS[k + i]
      v[i] = v[i] - cost[j]
      -- Numbers go to Redis as exact integers (below 2^53 Redis prints them in full).
      if same[i] then
        redis.call('HSET', key, 'v', v[i], 't', t[i])
      else
        redis.call('HSET', key, 'v', v[i], 't', t[i], 's', scale[j])
      end
      -- Expire no earlier than the bucket would be full again: a key that vanishes early reads as
      -- a full bucket, which is over-admission. The second of margin covers proxy-clock skew.
      redis.call('PEXPIRE', key, math.ceil(math.ceil((cap[j] - v[i]) / num[j]) / 1000) + 1000)
    end
    reply[r + 1] = v[i]
    reply[r + 2] = t[i] - now
    reply[r + 3] = bad[i]
    r = r + 3
  end
  k = k + n
end
return reply
