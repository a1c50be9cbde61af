-- Adds to the counters what the gateway admitted in process while Redis
-- could not decide (`on_error: local`), so the window that spans the
-- outage is not granted twice (see backlog.rs for what is recorded and
-- when this runs). Each key is added to as limits.lua would have counted
-- the same admissions, and gets the expiry limits.lua gives a write now.
--
-- KEYS[i]   a counter key, in limits.lua's layout for its algorithm; every
--           key of one call shares a slot.
-- ARGV[1]   now, integer ms on the gateway's clock (the clock the local
--           decisions used).
-- then per key, in KEYS order: algorithm, window w, n, and n numbers:
--   0 sliding_window  n = 2: prev, cur — units admitted in windows
--                     floor(now/w) - 1 and floor(now/w); added to the
--                     key's counts rolled to now's window
--   1 fixed_window    n = 1: count — units admitted in now's window; added
--   4 calendar_month  w is the month's end (ms); n = 2: index, count
--   2 sliding_log     n = 2k: k pairs ms, units — each unit becomes one
--                     member scored ms, named "<ms>:<j>" as limits.lua
--                     names them (j counting the members already at ms)
--   5 precision buckets  n = 1 + 2k: the precision p, then k pairs
--                     bucket, units — added to the key's buckets
--   3 gcra            n = 5: limit L, burst B, tat, rem, cost — the local
--                     admissions as one step x -> max(x + cost, D), D =
--                     tat + rem/L ms the TAT they reached alone, cost in
--                     1/L ms; the key's TAT becomes max(TAT + cost, D),
--                     at most 2 B w / L ms ahead of now
--
-- A key holding anything but a well-formed state of its algorithm (another
-- type, garbage, numbers past exact arithmetic) is skipped and left as it
-- is: it would fail its decisions anyway. Returns { added, skipped }, the
-- numbers of keys. Arguments that do not split as above are an error reply.

-- int, idiv, cdiv, str, EXACT, MIN_TTL, log_add, gcra_store and the
-- precision buckets' bk_read, bk_add and bk_store come from arith.lua,
-- prepended.

local function counter(key, pattern)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' then
    return nil, true
  end
  if not raw then
    return nil, false
  end
  local a, b = string.match(raw, pattern)
  local x, y = int(a), int(b)
  if x == nil or y == nil then
    return nil, true
  end
  return { x, y }, false
end

local function sliding_window(key, now, w, f)
  local dprev, dcur = f[1], f[2]
  local idx = idiv(now, w)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' then
    return false
  end
  local prev, cur, widx = 0, 0, idx
  if raw then
    local sw, sp, sc = string.match(raw, '^(%d+):(%d+):(%d+)$')
    local kw, kp, kc = int(sw), int(sp), int(sc)
    if kw == nil or kp == nil or kc == nil then
      return false
    end
    if kw >= idx then
      prev, cur, widx = kp, kc, kw
    elseif kw + 1 == idx then
      prev = kc
    end
  end
  prev, cur = prev + dprev, cur + dcur
  if (prev + cur) * w >= EXACT then
    return false
  end
  sw_store(key, now, w, widx, prev, cur)
  return true
end

local function fixed(key, now, idx, window_end, count, min_ttl)
  local state, bad = counter(key, '^(%d+):(%d+)$')
  if bad then
    return false
  end
  local widx, have = idx, 0
  if state and state[1] >= idx then
    widx, have = state[1], state[2]
  end
  local after = have + count
  if after >= EXACT then
    return false
  end
  local reset = math.max(0, window_end - now)
  redis.call('SET', key, str(widx) .. ':' .. str(after), 'PX', str(math.max(reset, min_ttl)))
  return true
end

local function fixed_window(key, now, w, f)
  local idx = idiv(now, w)
  return fixed(key, now, idx, (idx + 1) * w, f[1], math.min(w, MIN_TTL))
end

local function calendar_month(key, now, month_end, f)
  return fixed(key, now, f[1], month_end, f[2], MIN_TTL)
end

local function sliding_log(key, now, w, f)
  local kind = redis.call('TYPE', key).ok
  if kind ~= 'zset' and kind ~= 'none' then
    return false
  end
  for p = 1, #f, 2 do
    log_add(key, f[p], f[p + 1])
  end
  if now >= w then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', str(now - w))
  end
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local newest = int(last[2])
  if newest == nil then
    -- Nothing counts any more (or a score that is not a time): no expiry
    -- to set; an empty set does not exist.
    return last[2] == nil
  end
  redis.call('PEXPIRE', key, str(math.max(1, newest + w - now)))
  return true
end

local function gcra(key, now, w, f)
  local l, b, dtat, drem, cost = math.max(f[1], 1), f[2], f[3], f[4], f[5]
  local state, bad = counter(key, '^(%d+):(%d+)$')
  if bad then
    return false
  end
  -- Everything relative to now, in units of 1/L ms (may be negative).
  local x = (dtat - now) * l + drem
  if state then
    local tat, rem = state[1], state[2]
    if rem >= l then
      tat, rem = tat + 1, 0
    end
    x = math.max(x, (tat - now) * l + rem + cost)
  end
  x = math.min(x, 2 * b * w)
  if x <= 0 then
    -- Nothing of it reaches past now: the bucket is full either way.
    return true
  end
  gcra_store(key, now, x, l, w, cdiv(x, l))
  return true
end

local function buckets(key, now, w, f)
  local p = f[1]
  if p == nil or p == 0 or #f % 2 ~= 1 then
    return false
  end
  local list = bk_read(key, now, w, p)
  if list == nil then
    return false
  end
  local first = 0
  if now >= w then
    first = idiv(now - w, p)
  end
  for j = 2, #f, 2 do
    if f[j] >= first then
      bk_add(list, f[j], f[j + 1])
    end
  end
  bk_store(key, now, w, p, list)
  return true
end

local ALGORITHMS = {
  [0] = sliding_window,
  [1] = fixed_window,
  [2] = sliding_log,
  [3] = gcra,
  [4] = calendar_month,
  [5] = buckets,
}

local malformed = 'ERR tollgate push: expected now, then per key algorithm, window, n and n integers'
local now = int(ARGV[1])
if now == nil then
  return redis.error_reply(malformed)
end
local added, skipped = 0, 0
local a = 2
for i = 1, #KEYS do
  local alg, w, n = int(ARGV[a]), int(ARGV[a + 1]), int(ARGV[a + 2])
  if alg == nil or ALGORITHMS[alg] == nil or w == nil or w == 0 or n == nil or a + 2 + n > #ARGV then
    return redis.error_reply(malformed)
  end
  local f = {}
  for j = 1, n do
    local v = int(ARGV[a + 2 + j])
    if v == nil then
      return redis.error_reply(malformed)
    end
    f[j] = v
  end
  a = a + 3 + n
  if ALGORITHMS[alg](KEYS[i], now, w, f) then
    added = added + 1
  else
    skipped = skipped + 1
  end
end
if a ~= #ARGV + 1 then
  return redis.error_reply(malformed)
end
return { added, skipped }
