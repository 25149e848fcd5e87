-- redis_bucket.lua: the nginx + Lua contender of bench/compare.sh. One token-bucket decision per
-- request, by EVALSHA of lua/token_bucket.lua, over a connection pool (cosocket setkeepalive).
--
-- Debian ships libnginx-mod-http-lua but not lua-resty-redis, so this is a minimal RESP client of
-- its own: it sends exactly what lua-resty-redis would (one EVALSHA, EVAL only after NOSCRIPT) and
-- parses only the replies the script gives (integers, arrays, errors). Like the proxy's default
-- (`on_redis_error: open`, `timeout_ms: 25`), a failed or slow call lets the request through.

local M = {}

local tcp = ngx.socket.tcp
local concat = table.concat

local host, port, sha, body, format

-- Called from init_by_lua (in the master, before the workers fork): the script's text is read
-- once, for the EVAL that follows a NOSCRIPT. `state_format` is what buckets are written as
-- ("hash" or "packed"), as the proxy's `redis.state_format`.
function M.init(redis_host, redis_port, script_sha, script_path, state_format)
  host, port, sha, format = redis_host, redis_port, script_sha, state_format
  local f = assert(io.open(script_path, "rb"))
  body = f:read("*a")
  f:close()
end

local function command(args)
  local t = { "*", #args, "\r\n" }
  for i = 1, #args do
    local a = tostring(args[i])
    t[#t + 1] = "$" .. #a .. "\r\n" .. a .. "\r\n"
  end
  return concat(t)
end

-- Returns the reply, or nil, message, is_redis_error.
local function read_reply(sock)
  local line, err = sock:receive("*l")
  if not line then
    return nil, err
  end
  local kind, rest = line:sub(1, 1), line:sub(2)
  if kind == ":" then
    return tonumber(rest)
  elseif kind == "*" then
    local n, out = tonumber(rest), {}
    for i = 1, n do
      local v, e, redis_err = read_reply(sock)
      if v == nil then
        return nil, e, redis_err
      end
      out[i] = v
    end
    return out
  elseif kind == "-" then
    return nil, rest, true
  end
  return nil, "unexpected reply: " .. line
end

-- true when allowed (or when Redis failed: fail open), false when rejected. `redis_port` overrides
-- the port given to init (the paused Redis of the "Redis paused" scenario).
function M.allowed(key, capacity, scale, num, cost, redis_port)
  local sock = tcp()
  sock:settimeout(25)
  local ok, err = sock:connect(host, redis_port or port) -- takes a pooled connection when there is one
  if not ok then
    ngx.log(ngx.ERR, "redis connect: ", err)
    return true
  end
  local args = { "EVALSHA", sha, 1, key, "", format, 1, capacity, scale, num, cost, 1, 1 }
  local reply, redis_err
  ok, err = sock:send(command(args))
  if ok then
    reply, err, redis_err = read_reply(sock)
    if not reply and redis_err and err:find("^NOSCRIPT") then
      args[1], args[2] = "EVAL", body
      ok, err = sock:send(command(args))
      if ok then
        reply, err, redis_err = read_reply(sock)
      end
    end
  end
  if reply or redis_err then
    -- The connection is in a clean state (a whole reply was read): back into the pool.
    sock:setkeepalive(60000, 256)
  else
    sock:close()
  end
  if not reply then
    ngx.log(ngx.ERR, "redis: ", err)
    return true
  end
  -- The compact reply of a usual request (`now`, then held or -(held + 1)), or the full one.
  if #reply == 2 then
    return reply[2] >= 0
  end
  return reply[2] == 1
end

return M
