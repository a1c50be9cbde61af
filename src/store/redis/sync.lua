-- `sync` mode (src/decision/sync.rs): adds what one gateway admitted in
-- process since its last call to the fleet's counters, and answers the
-- fleet's totals, which the gateway decides against until its next call.
-- The keys, their layout and their expiries are limits.lua's, so gateways
-- in sync mode and gateways deciding every request in Redis share counts.
--
-- KEYS[i]   a counter key, in limits.lua's layout for its algorithm:
--           sliding window "<window>:<prev>:<cur>", fixed window (and
--           calendar month) "<window>:<count>"; every key of one call
--           shares a slot.
-- ARGV[1]   now, integer ms on the gateway's clock (the clock its
--           decisions used).
-- then per key, in KEYS order, five integers: kind, w, end, a, b
--   kind 0  sliding window of w ms; a, b: units admitted in windows
--           floor(now/w) - 1 and floor(now/w) (end is unused)
--   kind 1  fixed window (w ms, or a calendar month); a: its index (now's
--           window), b: units admitted in it; end: when it ends (ms)
-- A key whose units are both 0 is only read.
--
-- Returns three integers per key, in KEYS order: window, prev, cur — the
-- key's counts after the addition, rolled to now's window as limits.lua
-- rolls them (a fixed window answers 0 for prev and its count as cur; a
-- key absent or expired answers now's window and zeros). A key holding
-- anything else (another type, garbage, counts past exact arithmetic) is
-- left as it is and answers -1, 0, 0: it would fail exact decisions too.
-- Arguments that do not split as above are an error reply.

-- int, idiv, str, EXACT and MIN_TTL come from arith.lua, prepended.

local function sliding(key, now, w, dprev, dcur)
  local idx = idiv(now, w)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' then
    return -1, 0, 0
  end
  local prev, cur, widx = 0, 0, idx
  if raw then
    local sw, sp, sc = string.match(raw, '^(%d+):(%d+):(%d+)$')
    local kw, kp, kc = int(sw), int(sp), int(sc)
    if kw == nil or kp == nil or kc == nil then
      return -1, 0, 0
    end
    if kw >= idx then
      -- kw > idx: written by a gateway whose clock is ahead; its window
      -- is kept (State::at).
      prev, cur, widx = kp, kc, kw
    elseif kw + 1 == idx then
      prev = kc
    end
  end
  if dprev + dcur == 0 then
    return widx, prev, cur
  end
  prev, cur = prev + dprev, cur + dcur
  if (prev + cur) * w >= EXACT then
    return -1, 0, 0
  end
  sw_store(key, now, w, widx, prev, cur)
  return widx, prev, cur
end

local function fixed(key, now, w, window_end, idx, count)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' then
    return -1, 0, 0
  end
  local widx, have = idx, 0
  if raw then
    local sw, sc = string.match(raw, '^(%d+):(%d+)$')
    local kw, kc = int(sw), int(sc)
    if kw == nil or kc == nil then
      return -1, 0, 0
    end
    if kw >= idx then
      widx, have = kw, kc
    end
  end
  if count == 0 then
    return widx, 0, have
  end
  local after = have + count
  if after >= EXACT then
    return -1, 0, 0
  end
  local ttl = math.max(math.max(0, window_end - now), math.min(w, MIN_TTL))
  redis.call('SET', key, str(widx) .. ':' .. str(after), 'PX', str(ttl))
  return widx, 0, after
end

local malformed = 'ERR tollgate sync: expected now, then per key kind, w, end, a and b'
local now = int(ARGV[1])
if now == nil or #ARGV ~= 1 + 5 * #KEYS then
  return redis.error_reply(malformed)
end
local out = {}
for i = 1, #KEYS do
  local p = 2 + 5 * (i - 1)
  local kind, w, window_end, a, b =
    int(ARGV[p]), int(ARGV[p + 1]), int(ARGV[p + 2]), int(ARGV[p + 3]), int(ARGV[p + 4])
  if kind == nil or w == nil or w == 0 or window_end == nil or a == nil or b == nil then
    return redis.error_reply(malformed)
  end
  local x, y, z
  if kind == 0 then
    x, y, z = sliding(KEYS[i], now, w, a, b)
  elseif kind == 1 then
    x, y, z = fixed(KEYS[i], now, w, window_end, a, b)
  else
    return redis.error_reply(malformed)
  end
  out[#out + 1] = x
  out[#out + 1] = y
  out[#out + 1] = z
end
return out
