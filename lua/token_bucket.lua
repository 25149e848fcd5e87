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
-- ARGV[2]  the format to write buckets in: "hash", "packed" or "packed_ttl" (see State below).
--          All are always read, so proxies writing any of them share buckets exactly.
-- ARGV[3]  m, how many distinct limits the batch's requests draw on (most batches: one per route
--          seen), then for each of them, 1 to m:
--          capacity  whole tokens the bucket holds (the burst)
--          scale     units per token
--          num       units the bucket gains per microsecond (the rate is num/scale tokens per µs),
--                    or a quota's period: "day", "week" (ISO, from Monday) or "month". A quota
--                    (scale 1) does not refill: it is whole again once `now` is in a later
--                    period (UTC) than the instant it was written at. Or "lease:<ms>:<id>": a
--                    concurrency limit (capacity = how many at once, scale 1, cost 1), whose key
--                    is a sorted set of lease ids scored by the microsecond they expire at; an
--                    admitted request adds its lease <id> for <ms> (released by ZREM), so leases
--                    a dead proxy never released expire by themselves.
--          cost      whole tokens a request takes
-- Then, for each request in turn:
--          n         how many limits it has; its buckets are the next n KEYS. Negative (-n): a
--                    charge of usage a response reported, not a decision: each limit's cost
--                    (negative: a refund) is taken whatever the bucket holds, going into debt
--          and n limit numbers (1 to m), one per bucket
--          Or nothing, when m is 1 and every request is a decision on that one limit (the usual
--          batch): each key is then a request of its own. Two arguments fewer per request are a
--          share of Redis's cost per decision worth saving (README, "Benchmarks").
-- KEYS     every request's buckets, in order. On a Redis Cluster all of them share one slot.
--
-- Reply: `now` (the instant every request was decided at: a quota's boundary depends on it), then
-- for each request in turn { allowed, then for each of its limits: held, lag_us, bad }, one flat
-- list of integers:
--   allowed    1 when every bucket had `cost` tokens and all were taken, 0 when none was taken
--   held       units the bucket holds: after this request when allowed, refilled but untouched when not
--   lag_us     how far the bucket's instant is ahead of `now` (0 unless another proxy's clock runs
--              ahead): it refills from now + lag_us on
--   bad        1 when the key held something that is not a bucket (another type, missing or
--              non-numeric fields): it was deleted and read as a full bucket, so it is limited again
-- Or, when every request of the call was the usual one (one limit, and a bucket whose instant is
-- `now` after this request), `now` and then one integer per request: `held` when allowed,
-- -(held + 1) when not (exact: a refused bucket holds less than its cost). Three integers fewer
-- per request are a share of Redis's cost per decision worth saving (README, "Benchmarks"); the
-- reply's length tells the two apart, as every full reply is longer than 1 + the requests.
-- The caller derives what clients see (remaining, reset, retry) from `held` with the same
-- arithmetic as the in-memory store (src/limiter/bucket.rs), so the two cannot disagree.
--
-- State: per bucket v = units held, t = the microsecond v was computed for, s = the scale v is in
-- (a quota's: its amount, so that a reload changing it keeps what was used),
-- stored in one of two formats:
--   hash    a hash with fields v, t, s as integer strings (the first versions wrote no s); what
--           every version reads.
--   packed  a 24-byte string, struct.pack('<ddd', v, t, s): three little-endian doubles, each an
--           exact integer. One MGET for the whole batch and one SET … PX per write, where a hash
--           needs HMGET, HSET and PEXPIRE: Redis runs a quarter fewer instructions per decision.
--           Versions before it read a packed key as foreign and reset it to full, so a fleet turns
--           it on only once every proxy reads it (README, "Upgrading a fleet to packed buckets").
--   packed_ttl  a 32-byte string, struct.pack('<dddd', v, t, s, e): packed, and e, an instant (µs,
--           on the writer's clock) that the key's expiry covers with its second of margin. A write
--           whose bucket will be full by e keeps the key's expiry (it overwrites the value in
--           place, SETRANGE) instead of setting it again (see put below). Versions before it
--           read such a key as foreign, as above; packed readers of this version and later read
--           it.
--   By hand: redis-cli EVAL "return {struct.unpack('<ddd', redis.call('GET', KEYS[1]))}" 1 KEY
--            ('<dddd' for a 32-byte packed_ttl key)
-- Units are exact integers: refill adds (elapsed µs × num) units, so no rounding is ever
-- carried or lost, and the caller keeps capacity × scale + num within 2^53 so that Lua's doubles
-- stay exact. When a reload changed the limit, the tokens held carry over (converted to the new
-- scale, rounded down) and never exceed the new capacity.
--
-- By hand:  redis-cli --eval lua/token_bucket.lua rl:{demo}:l , "" hash 1 3 1000000 1 1 1 1
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

-- The limits, in units: read once per batch, however many requests draw on them. Quotas and
-- leases are rare, so their tables are made only for a batch that has one (NONE stands in).
local ttl = ARGV[2] == 'packed_ttl'
local packed = ttl or ARGV[2] == 'packed'
local m = tonumber(ARGV[3])
local NONE = {}
local cap, scale, unit, unit_text, num, cost = {}, {}, {}, {}, {}, {}
local period, lease_ms, lease_id = NONE, NONE, NONE
for j = 1, m do
  local a = 4 + 4 * (j - 1)
  local capacity, s = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  scale[j] = s
  cap[j] = capacity * s
  num[j] = tonumber(ARGV[a + 2])
  if not num[j] then
    local text = ARGV[a + 2]
    local ms, id = string.match(text, '^lease:(%d+):(%d+)$')
    if ms then
      if lease_ms == NONE then
        lease_ms, lease_id = {}, {}
      end
      lease_ms[j], lease_id[j] = tonumber(ms), id
    elseif text == 'day' or text == 'week' or text == 'month' then
      if period == NONE then
        period = {}
      end
      period[j] = text
    else
      return redis.error_reply('unknown refill ' .. text)
    end
  end
  cost[j] = tonumber(ARGV[a + 3]) * s
  -- What a state's `s` records: the scale, or a quota's amount (its state then says how much was
  -- used, whatever the amount becomes).
  if period[j] then
    unit_text[j], unit[j] = ARGV[a], capacity
  else
    unit_text[j], unit[j] = ARGV[a + 1], s
  end
end

-- Calendar periods in UTC, as src/calendar.rs computes them (Howard Hinnant's civil-date
-- algorithms; every step an exact integer in a double).
local DAY = 86400000000
local floor = math.floor
local function days_from_civil(y, mo, d)
  if mo <= 2 then
    y = y - 1
  end
  local era = floor(y / 400)
  local yoe = y - era * 400
  local mp = mo > 2 and mo - 3 or mo + 9
  local doy = floor((153 * mp + 2) / 5) + d - 1
  return era * 146097 + yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + doy - 719468
end
local function civil_month(day)
  local z = day + 719468
  local era = floor(z / 146097)
  local doe = z - era * 146097
  local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
  local mp = floor((5 * doy + 2) / 153)
  local mo = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if mo <= 2 then
    y = y + 1
  end
  return y, mo
end
-- The first microsecond of the period holding `t` (next = 0), or of the one after it (next = 1).
local function boundary(per, t, next)
  local day = floor(t / DAY)
  if per == 'day' then
    return (day + next) * DAY
  elseif per == 'week' then
    -- 1970-01-01 was a Thursday; a week cut by the epoch starts there.
    return math.max(0, day - (day + 3) % 7 + 7 * next) * DAY
  end
  local y, mo = civil_month(day)
  mo = mo + next
  if mo > 12 then
    y, mo = y + 1, 1
  end
  return days_from_civil(y, mo, 1) * DAY
end

-- Each request's small numbers (its limit count and limit numbers), converted once per text.
local number = setmetatable({}, {
  __index = function(known, text)
    local n = tonumber(text)
    known[text] = n
    return n
  end,
})

local pack, unpack_state = struct.pack, struct.unpack

-- What a packed bucket holds (and, written as packed_ttl, the instant its expiry covers; nil
-- when unknown), or nil when `text` is not one.
local function unpacked(text)
  local v, t, s, e
  local n = #text
  if n == 24 then
    v, t, s = unpack_state('<ddd', text)
  elseif n == 32 then
    v, t, s, e = unpack_state('<dddd', text)
    if not (e >= 0 and e <= 9007199254740992 and e % 1 == 0) then
      return nil
    end
  else
    return nil
  end
  -- Whole numbers in 0..2^53 (NaN fails the first comparison).
  if v >= 0 and t >= 0 and s >= 0 and v <= 9007199254740992 and t <= 9007199254740992
      and s <= 9007199254740992 and v % 1 == 0 and t % 1 == 0 and s % 1 == 0 then
    return v, t, s, e
  end
  return nil
end

-- The bucket at `key` as stored: units, instant, scale (nil when a hash has none) and its kind:
-- 'hash', 'packed', 'none' (no key) or 'bad' (something else).
local function stored(key)
  -- pcall: a key of another type answers WRONGTYPE, which must heal the key, not fail every
  -- decision of this client forever.
  local state = redis.pcall('HMGET', key, 'v', 't', 's')
  if state.err then
    local text = redis.pcall('GET', key)
    if type(text) == 'string' then
      local v, t, s = unpacked(text)
      if v then
        return v, t, s, 'packed'
      end
    end
    return nil, nil, nil, 'bad'
  elseif not state[1] and not state[2] and not state[3] then
    -- No bucket here: a new client, or a hash of something else (checked only then).
    if redis.call('EXISTS', key) == 1 then
      return nil, nil, nil, 'bad'
    end
    return nil, nil, nil, 'none'
  end
  local v, t = whole(state[1]), whole(state[2])
  if v == nil or t == nil then
    return nil, nil, nil, 'bad'
  end
  -- No `s` at all (HMGET gives false): written in this scale by a version that stored none; the
  -- next write adds it.
  return v, t, state[3] or nil, 'hash'
end

-- Writing packed, every key is read up front by one MGET (a hash reads as nil there, and is read
-- as a hash when needed), and a later request of the batch reads what an earlier one wrote from
-- `known`, by key: the string the key holds (unpacked where it is used: checked there, as one
-- decision's read), false for no key, nil when not known (a hash, say). One table, not one per
-- field: each table a call fills costs Redis its allocations and its growth, per key.
-- Writing hashes, each read goes to Redis.
local known = {}
-- Lua unpacks at most a few thousand values at once: commands over many keys go in slices.
local SLICE = 1000
if packed then
  local missing = {}
  for from = 1, #KEYS, SLICE do
    local to = math.min(from + SLICE - 1, #KEYS)
    local got = redis.call('MGET', unpack(KEYS, from, to))
    for i = from, to do
      local text = got[i - from + 1]
      if text then
        known[KEYS[i]] = text
      else
        missing[#missing + 1] = KEYS[i]
      end
    end
  end
  -- Not strings: no key (new clients) or a hash of the other format. One call tells whether
  -- none of them exists, as is usual; otherwise each is looked at when needed.
  for from = 1, #missing, SLICE do
    local to = math.min(from + SLICE - 1, #missing)
    if redis.call('EXISTS', unpack(missing, from, to)) == 0 then
      for i = from, to do
        known[missing[i]] = false
      end
    end
  end
end

-- The bucket at `key` refilled up to now under limit j: units held, its instant, 1 when the key
-- held something that is not a bucket (it is deleted and read as a full bucket, so limited
-- again), whether a hash write may leave its `s` as it is, and the kind it was stored as.
local function refill(key, j)
  if lease_ms[j] then
    -- Free leases: the limit less the ones that have not expired. Another type of key is
    -- something else's: deleted (and reported), which frees every lease.
    local bad = 0
    local gone = redis.pcall('ZREMRANGEBYSCORE', key, '-inf', now)
    if type(gone) == 'table' and gone.err then
      redis.call('DEL', key)
      bad = 1
      -- Not a bucket any more: a later request of the call reads it again (put overwrites
      -- in place only what it knows to be a packed_ttl value).
      known[key] = nil
    end
    local free = cap[j] - redis.call('ZCARD', key)
    if free < 0 then
      free = 0
    end
    return free, now, bad, false, 'lease'
  end
  local held, at, was, kind
  if packed then
    local text = known[key]
    if text == nil then
      -- Not a string: no key (a new client: one call) or a hash of the other format.
      if redis.call('TYPE', key).ok == 'none' then
        kind = 'none'
      else
        held, at, was, kind = stored(key)
      end
    elseif text == false then
      kind = 'none'
    else
      held, at, was = unpacked(text)
      kind = held and 'packed' or 'bad'
    end
  else
    held, at, was, kind = stored(key)
  end
  local bad, same = 0, false
  if kind == 'bad' then
    bad = 1
  elseif held == nil then
    -- No key: a full bucket.
  elseif was == unit_text[j] or was == unit[j] then
    -- The common case: a comparison, no conversion.
    same = kind == 'hash'
  elseif was ~= nil then
    was = whole(was)
    if was == nil or was == 0 then
      bad = 1
    elseif period[j] then
      -- Another amount: what was used stays used.
      held = math.max(0, cap[j] - math.max(0, was - held))
    elseif was ~= scale[j] then
      held = rescale(held, was, scale[j])
    end
  end
  if bad == 1 then
    redis.call('DEL', key)
    held, kind = nil, 'none'
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
      if period[j] then
        if boundary(period[j], now, 0) > at then
          held = cap[j]
        end
      else
        local gained = (now - at) * num[j]
        if gained >= missing then
          held = cap[j]
        else
          held = held + gained
        end
      end
    end
    at = now
  end
  if packed and bad == 1 then
    known[key] = false
  end
  return held, at, bad, same, kind
end

-- The expiry `us` from now calls for, in whole milliseconds as text ('%d': below 2^53 Redis prints
-- them in full too) with the second of margin. Formatting is a measurable share of a
-- decision (README, "Benchmarks"), and a batch's requests mostly need the same one: each is
-- formatted once.
local expiries = {}
local function expiry(us, extra_ms)
  local ms = math.ceil(us / 1000) + 1000 + extra_ms
  local text = expiries[ms]
  if not text then
    text = string.format('%d', ms)
    expiries[ms] = text
  end
  return text
end

-- Writes a packed bucket, whose key must outlive `us` from now (and the second of margin).
-- Writing packed_ttl, the value also records `e`, an instant the key's expiry is known to cover
-- (it was set to e + 1 s, on this proxy's clock). A write that needs no later one keeps the expiry:
-- setting one costs Redis about as much as the SET itself. It overwrites the 32 bytes in place
-- (SETRANGE at 0), which keeps the expiry as SET … KEEPTTL would, costs Redis less and answers a
-- number, where a SET's status reaches Lua as a table. `e` comes only from a packed_ttl value the
-- key holds now (read by the MGET or written by this call), so the write replaces all of it. A
-- write that needs a later expiry sets it SLACK_US further than it needs, so that the writes of
-- the next seconds keep it.
-- Instants near 2^53 are not exact as doubles, so the comparisons are of spans from now.
local SLACK_US = 5000000
local function put(key, j, held, at, us, e)
  local u = unit[j]
  local value
  if ttl then
    if e and e - now >= us then
      value = pack('<dddd', held, at, u, e)
      redis.call('SETRANGE', key, '0', value)
    else
      -- Recorded within 2^53 (a bucket refilling over centuries may be full later): less than
      -- the expiry covers, never more.
      if us + SLACK_US > 9007199254740992 - now then
        e = 9007199254740992
      else
        e = now + us + SLACK_US
      end
      value = pack('<dddd', held, at, u, e)
      redis.call('SET', key, value, 'PX', expiry(us, SLACK_US / 1000))
    end
  else
    value = pack('<ddd', held, at, u)
    redis.call('SET', key, value, 'PX', expiry(us, 0))
  end
  known[key] = value
end

-- Writes the bucket at `key`, which now holds `held` units at instant `at` under limit j, with an
-- expiry no earlier than the bucket would be full again (a quota: its period's end): a key that
-- vanishes early reads as a full bucket, which is over-admission. The second of margin covers
-- proxy-clock skew. Numbers go to Redis as exact integers ('%d'; below 2^53 Redis prints them in
-- full too).
local function write(key, j, held, at, same, kind)
  if lease_ms[j] then
    redis.call('ZADD', key, now + lease_ms[j] * 1000, lease_id[j])
    -- Only ever longer: a proxy configured with shorter leases must not expire others' leases.
    if redis.call('PTTL', key) < lease_ms[j] + 1000 then
      redis.call('PEXPIRE', key, lease_ms[j] + 1000)
    end
    return
  end
  local us
  if period[j] then
    -- Whole (a refund can make it so), it is the same as no key from its instant on.
    us = (held < cap[j] and boundary(period[j], at, 1) or at) - now
  else
    -- From now: a bucket in debt (or written by a clock ahead) refills only from `at`.
    us = math.ceil((cap[j] - held) / num[j]) + (at - now)
  end
  if packed then
    -- The instant the expiry covers, when the key holds a packed_ttl value (refill checked it).
    local text = known[key]
    local e
    if text then
      e = select(4, unpacked(text))
    end
    put(key, j, held, at, us, e)
    return
  end
  local ms = expiry(us, 0)
  if kind == 'packed' then
    -- HSET on a string is refused: the key changes type.
    redis.call('DEL', key)
  end
  if same then
    redis.call('HSET', key, 'v', held, 't', at)
  else
    redis.call('HSET', key, 'v', held, 't', at, 's', unit[j])
  end
  redis.call('PEXPIRE', key, ms)
end

-- A charge of limit j's cost from a bucket holding `held` at `at`, as src/limiter/bucket.rs
-- `debit` does: a refund (negative cost) up to the capacity; more than it holds leaves it empty
-- with its instant moved ahead by the time the refill takes to pay the rest (a debt, which every
-- version reads as a bucket written ahead); a quota is left empty instead.
local function debit(j, held, at)
  local c = cost[j]
  if c < 0 then
    return math.min(cap[j], held - c), at
  elseif held >= c then
    return held - c, at
  elseif period[j] then
    return 0, at
  end
  -- A century at most (as bucket.rs DEBT_HORIZON_US): instants stay exact however often charged.
  return 0, math.min(at + math.ceil((c - held) / num[j]), now + 3153600000000000)
end

local reply = { now }
local r = 1
-- Compact (see the header) while every request so far was the usual one; the first that is not
-- rewrites the replies so far in full.
local compact = true
local function expand()
  local full, f = { now }, 1
  for i = 2, r do
    local x = reply[i]
    if x >= 0 then
      full[f + 1], full[f + 2] = 1, x
    else
      full[f + 1], full[f + 2] = 0, -x - 1
    end
    full[f + 3], full[f + 4] = 0, 0
    f = f + 4
  end
  reply, r, compact = full, f, false
end
local k = 0
local a = 4 + 4 * m
local args = #ARGV
local v, t, bad, same, kind, lim
local uniform = m == 1 and a > args
local keys = #KEYS
while (uniform and k < keys) or (not uniform and a <= args) do
  local n = uniform and 1 or number[ARGV[a]]
  -- The usual request, decided here without the general steps below: one bucket of a refilling
  -- limit, stored packed in its scale or not at all. The arithmetic is refill's and write's for
  -- that case, step for step.
  local j = n == 1 and packed and (uniform and 1 or number[ARGV[a + 1]])
  local key = KEYS[k + 1]
  -- What the key holds: false for nothing, a string (usual when it is a bucket in the limit's
  -- scale), nil when not usual.
  local text
  if j and period[j] == nil and lease_ms[j] == nil then
    text = known[key]
  end
  local held, at, s, e
  if text then
    held, at, s, e = unpacked(text)
  end
  if text == false or (held and s == unit[j]) then
    local c = cap[j]
    if text == false then
      held, at = c, now
    else
      if held > c then
        held = c
      end
      if now > at then
        local missing = c - held
        if missing > 0 then
          local gained = (now - at) * num[j]
          if gained >= missing then
            held = c
          else
            held = held + gained
          end
        end
        at = now
      end
    end
    local allowed = 0
    if held >= cost[j] then
      allowed = 1
      held = held - cost[j]
      put(key, j, held, at, math.ceil((c - held) / num[j]) + (at - now), e)
    end
    if compact and at == now then
      r = r + 1
      reply[r] = allowed == 1 and held or -held - 1
    else
      if compact then
        expand()
      end
      reply[r + 1] = allowed
      reply[r + 2] = held
      reply[r + 3] = at - now
      reply[r + 4] = 0
      r = r + 4
    end
    a = a + 2
    k = k + 1
  else
    if not v then
      v, t, bad, same, kind, lim = {}, {}, {}, {}, {}, {}
    end
    if compact then
      expand()
    end
    -- A charge: each limit's cost (negative: a refund) is taken whatever the bucket holds.
    local charge = n < 0
    if charge then
      n = -n
    end
    local allowed = 1
    for i = 1, n do
      j = uniform and 1 or number[ARGV[a + i]]
      lim[i] = j
      v[i], t[i], bad[i], same[i], kind[i] = refill(KEYS[k + i], j)
      if v[i] < cost[j] and not charge then
        allowed = 0
      end
    end
    a = a + 1 + n
    r = r + 1
    reply[r] = allowed
    for i = 1, n do
      j = lim[i]
      if charge then
        v[i], t[i] = debit(j, v[i], t[i])
        write(KEYS[k + i], j, v[i], t[i], same[i], kind[i])
      elseif allowed == 1 then
        v[i] = v[i] - cost[j]
        write(KEYS[k + i], j, v[i], t[i], same[i], kind[i])
      end
      reply[r + 1] = v[i]
      reply[r + 2] = t[i] - now
      reply[r + 3] = bad[i]
      r = r + 3
    end
    k = k + n
  end
end
return reply
