-- Sliding-window counter over every limit of one request (DESIGN §4).
--
-- KEYS[i]   the counter of limit i for this identity: one string
--           "<window>:<prev>:<cur>" (window index, count of window-1, count
--           of window), so an identity costs one small key per limit.
-- ARGV[1]   now, integer ms since the epoch (the caller's clock), or the
--           string TIME to read the server's clock (`clock: redis`).
-- ARGV[3i-1], ARGV[3i], ARGV[3i+1]
--           limit L, window w (ms, >= 1) and cost c of KEYS[i].
--
-- Returns a flat integer array:
--   { allowed, admits_1, remaining_1, reset_ms_1, retry_after_ms_1, ... }
-- allowed/admits are 1 or 0; retry_after_ms is -1 when the limit can never
-- admit the request (c > L). allowed = 1 only when every limit admits, and
-- only then is anything written: each key gets cur + c and an expiry at the
-- instant its counts have fully decayed (reset_ms), so idle identities
-- vanish. A denied request writes nothing.
--
-- A key holding anything but a well-formed counter (another type, garbage)
-- is an error reply before anything is written: never a guessed decision.
--
-- This mirrors src/limit/sliding_window.rs number for number: everything is
-- kept multiplied by w, so only integers appear. Lua numbers are doubles,
-- exact for integers below 2^53; every product here is at most
-- (prev + cur + c) * w, and the script refuses (error reply) arguments or
-- state for which that bound or L * w reaches 2^53. Divisions go through
-- idiv/cdiv, which correct the rounded double quotient to the exact integer
-- one.

local EXACT = 9007199254740992 -- 2^53

local function fail(msg)
  return redis.error_reply('ERR tollgate sliding_window: ' .. msg)
end

-- A non-negative integer below 2^53, or nil.
local function int(s)
  local n = tonumber(s)
  if n == nil or n < 0 or n >= EXACT or n ~= math.floor(n) then
    return nil
  end
  return n
end

-- floor(a / b) for integers 0 <= a < 2^53, b >= 1. The double quotient is
-- correctly rounded and may land on the neighbouring integer; one step fixes it.
local function idiv(a, b)
  local q = math.floor(a / b)
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

local function str(n)
  return string.format('%.0f', n)
end

local n = #KEYS
if #ARGV ~= 1 + 3 * n then
  return fail('expected 1 + 3 * #KEYS arguments')
end
-- tollgate issue 4 (clock: redis): begin
local now_arg = ARGV[1]
if now_arg == 'TIME' then
  local t = redis.call('TIME')
  now_arg = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local now = int(now_arg)
-- tollgate issue 4 (clock: redis): end
if now == nil then
  return fail('now must be an integer in [0, 2^53)')
end

local reply = { 1 }
local writes = {}
local allowed = true

for i = 1, n do
  local key = KEYS[i]
  local l = int(ARGV[3 * i - 1])
  local w = int(ARGV[3 * i])
  local c = int(ARGV[3 * i + 1])
  if l == nil or w == nil or c == nil or w == 0 then
    return fail('limit, window and cost of ' .. key .. ' must be integers in [0, 2^53), window >= 1')
  end
  local idx = idiv(now, w)
  local e = now - idx * w

  -- The stored counts, rolled forward to window idx (State::at).
  local prev, cur = 0, 0
  local widx = idx
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' and raw.err then
    return fail(key .. ': ' .. raw.err)
  end
  if raw then
    local sw, sp, sc = string.match(raw, '^(%d+):(%d+):(%d+)$')
    local kw, kp, kc = int(sw), int(sp), int(sc)
    if sw == nil or kw == nil or kp == nil or kc == nil then
      return fail(key .. ' does not hold a "<window>:<prev>:<cur>" counter')
    end
    if kw >= idx then
      -- kw > idx: a gateway whose clock is ahead wrote this; keep its
      -- window rather than resetting the counts (State::at).
      prev, cur, widx = kp, kc, kw
    elseif kw + 1 == idx then
      prev, cur = kc, 0
    end
  end

  if l * w >= EXACT or (prev + cur + math.min(c, l)) * w >= EXACT then
    return fail(key .. ': counts times window reach 2^53, beyond exact arithmetic')
  end

  -- sliding_window::check, times w: E*w = prev*(w-e) + cur*w.
  local lw = l * w
  local decayed = prev * (w - e)
  local admits = c <= l and decayed + (cur + c) * w <= lw
  local cur_after = cur
  if admits then
    cur_after = cur + c
  end
  local used = decayed + cur_after * w
  local remaining = 0
  if lw > used then
    remaining = idiv(lw - used, w)
  end
  local reset = 0
  if cur_after > 0 then
    reset = 2 * w - e
  elseif prev > 0 then
    reset = w - e
  end
  local retry
  if admits then
    retry = 0
  elseif c > l then
    retry = -1
  elseif cur + c <= l then
    -- Inside this window: smallest d with prev*(w-e-d) + (cur+c)*w <= L*w.
    retry = cdiv(decayed + (cur + c) * w - lw, prev)
  else
    -- Past the boundary, cur becomes prev: smallest e' with
    -- cur*(w-e') <= (L-c)*w.
    retry = (w - e) + cdiv(w * (cur - (l - c)), cur)
  end

  if not admits then
    allowed = false
  end
  reply[#reply + 1] = admits and 1 or 0
  reply[#reply + 1] = remaining
  reply[#reply + 1] = reset
  reply[#reply + 1] = retry
  writes[i] = { str(widx) .. ':' .. str(prev) .. ':' .. str(cur_after), reset }
end

if not allowed then
  reply[1] = 0
  return reply
end

for i = 1, n do
  local value, ttl = writes[i][1], writes[i][2]
  if ttl > 0 then
    redis.call('SET', KEYS[i], value, 'PX', str(ttl))
  else
    -- Nothing left to decay (cost 0 on an empty counter): absent is the
    -- same state, and costs no memory.
    redis.call('DEL', KEYS[i])
  end
end
return reply
