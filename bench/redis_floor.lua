-- bench/redis_floor.lua: the least a packed decision's script can do, for bench/redis_instructions.sh
-- (SCRIPT=bench/redis_floor.lua FORMATS=packed): read the batch's keys with one MGET and write each
-- with SET … PX, no arithmetic, a reply of one integer per request. What lua/token_bucket.lua spends
-- above it is its own work (the refill, the format checks, the reply).
local got = redis.call('MGET', unpack(KEYS))
local reply = {}
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], 'xxxxxxxxxxxxxxxxxxxxxxxx', 'PX', 100000)
  reply[i] = 1
end
return reply
