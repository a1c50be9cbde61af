-- Shared prelude of tollgate's scripts: exact integer arithmetic on Lua's
-- doubles, the `now` argument, and what the decision and backlog scripts
-- write alike (the shortest expiry, sliding-window counters, sliding-log
-- members, precision buckets). Prepended to every script that reads or writes counters
-- (limits.lua, refund.lua, push.lua, sync.lua, settle.lua; see the `concat!`
-- of each in src/store/redis/), so they read and write state the same way.

local EXACT = 9007199254740992 -- 2^53

-- A non-negative integer below 2^53, or nil.
local function num(s)
  local n = tonumber(s)
  if n ~= nil and n >= 0 and n < EXACT and n % 1 == 0 then
    return n
  end
  return nil
end

-- num, remembered per call: the arguments and stored counts of a batch
-- repeat the same few numbers, and reading a decimal (strtod) costs more
-- than a table lookup.
local read = {}
local function int(s)
  if s == nil then
    return nil
  end
  local known = read[s]
  if known ~= nil then
    return known or nil
  end
  local n = num(s) or false
  read[s] = n
  return n or nil
end

-- floor(a / b) for integers 0 <= a < 2^53, b >= 1. The double quotient is
-- correctly rounded and may land on the neighbouring integer; one step fixes it.
local floor = math.floor
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceil(a / b), same domain.
local function cdiv(a, b)
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- The decimal of an integer, remembered per call like int. %d formats it
-- as a C long, exact below 2^53 and cheaper than a double's %.0f.
local shown = {}
local function str(n)
  local s = shown[n]
  if s == nil then
    s = string.format('%d', n)
    shown[n] = s
  end
  return s
end

-- `now` in ms from ARGV[1]: an integer, or the string TIME for the server's
-- clock (`clock: redis`, so gateways with skewed clocks agree). nil if bad.
local function now_ms(arg)
  if arg == 'TIME' then
    local t = redis.call('TIME')
    arg = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return int(arg)
end

-- Keys whose state runs out sooner (a GCRA bucket refills in c*w/L ms, a
-- fixed window may end a millisecond after a write) still live this long,
-- or one window if that is shorter. State that no longer counts is the
-- same as no state, so keeping it a little longer is harmless;
-- expiring it sooner is not when clocks disagree (Redis expires by its own
-- clock, decisions use the gateway's, and a gateway a little behind must
-- still see what one a little ahead wrote).
local MIN_TTL = 60000

-- Writes the sliding-window counter of window widx at key, with the
-- expiry limits.lua gives a write: the end of the window after widx while
-- cur counts, else the end of widx (widx is past now's window when a
-- gateway whose clock is ahead wrote it). The scripts that add to counters
-- outside a decision (sync.lua, push.lua, settle.lua) write through this.
local function sw_store(key, now, w, widx, prev, cur)
  local e = now - widx * w
  local ttl = w - e
  if cur > 0 then
    ttl = 2 * w - e
  end
  redis.call('SET', key, str(widx) .. ':' .. str(prev) .. ':' .. str(cur), 'PX', str(ttl))
end

-- Writes the GCRA state whose theoretical arrival time is base + x/l ms
-- (x in units of 1/l ms): its whole ms and the remainder, expiring reset
-- ms away but not before min(w, MIN_TTL); a state with nothing left
-- (reset 0) is deleted instead, absent being the same.
local function gcra_store(key, base, x, l, w, reset)
  if reset > 0 then
    local q = idiv(x, l)
    redis.call('SET', key, str(base + q) .. ':' .. str(x - q * l), 'PX',
      str(math.max(reset, math.min(w, MIN_TTL))))
  else
    redis.call('DEL', key)
  end
end

-- Adds `units` members at `ms` to the sliding log `key`, named `ms:n` with
-- n counting on from the members that millisecond already has, so every
-- admitted unit is a member of its own; ZADD in batches of 1000.
local function log_add(key, ms, units)
  local taken = redis.call('ZCOUNT', key, str(ms), str(ms))
  local args = {}
  for j = 1, units do
    args[#args + 1] = str(ms)
    args[#args + 1] = str(ms) .. ':' .. str(taken + j - 1)
    if #args >= 2000 then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  if #args > 0 then
    redis.call('ZADD', key, unpack(args))
  end
end

-- Precision buckets (src/limit/buckets.rs): a hash of "<bucket index>" ->
-- units, beside "total", their sum. Bucket b counts at now while
-- (b + 1) * p + w > now. Returns the buckets that count, ascending, as
-- { b, n } pairs without empty ones, and their total; or nil and an error
-- message when key holds anything else.
local function bk_read(key, now, w, p)
  local raw = redis.pcall('HGETALL', key)
  if raw.err then
    return nil, key .. ': ' .. raw.err
  end
  local first = 0
  if now >= w then
    first = idiv(now - w, p)
  end
  local list, total = {}, 0
  for i = 1, #raw, 2 do
    if raw[i] ~= 'total' then
      local b, n = int(raw[i]), int(raw[i + 1])
      if b == nil or n == nil or (b + 1) * p + w >= EXACT then
        return nil, key .. ' does not hold a hash of "<bucket>" counts and their "total"'
      end
      if b >= first and n > 0 then
        list[#list + 1] = { b, n }
        total = total + n
      end
    end
  end
  table.sort(list, function(x, y)
    return x[1] < y[1]
  end)
  return list, total
end

-- Adds n units to bucket b of list (ascending), in place.
local function bk_add(list, b, n)
  if n <= 0 then
    return
  end
  for i = 1, #list do
    if list[i][1] == b then
      list[i][2] = list[i][2] + n
      return
    elseif list[i][1] > b then
      table.insert(list, i, { b, n })
      return
    end
  end
  list[#list + 1] = { b, n }
end

-- Writes list (ascending { b, n }) and its total at key, expiring when its
-- newest bucket stops counting; a list with nothing left is deleted,
-- absent being the same. The key is rewritten whole: at most 61 buckets.
local function bk_store(key, now, w, p, list)
  redis.call('DEL', key)
  local args, total, newest = {}, 0, nil
  for i = 1, #list do
    local b, n = list[i][1], list[i][2]
    if n > 0 then
      args[#args + 1] = str(b)
      args[#args + 1] = str(n)
      total = total + n
      newest = b
    end
  end
  if newest == nil or (newest + 1) * p + w <= now then
    return
  end
  args[#args + 1] = 'total'
  args[#args + 1] = str(total)
  redis.call('HSET', key, unpack(args))
  redis.call('PEXPIRE', key, str((newest + 1) * p + w - now))
end
