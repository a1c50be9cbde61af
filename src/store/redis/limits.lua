-- A batch of requests, each decided with all its limits together (DESIGN §4).
-- Requests are decided one after another, independently: each sees what
-- the ones before it in the batch consumed, as if each were its own call.
-- A single request is a batch of one.
--
-- KEYS      the keys of every request, request after request; request r
--           owns the next n_r of them. Key i of a request holds the state
--           of its limit i for this identity. Its layout depends on
--           the limit's algorithm (the key name carries the algorithm, so
--           one key never changes layout):
--             sliding_window  string "<window>:<prev>:<cur>"
--             fixed_window    string "<window>:<count>" (calendar months
--                             too, with the month index as window)
--             sliding_log     sorted set, one member per admitted unit,
--                             scored by its time in ms; members are
--                             "<ms>:<n>" with n counting the members already
--                             at that score, so same-millisecond units of
--                             any gateway never collide
--             gcra            string "<tat>:<rem>", the theoretical arrival
--                             time tat + rem/L ms
-- ARGV[1]   S, the number of shapes that follow. A shape is what a request
--           asks apart from its keys, 2 + 5 n arguments:
--   n         its number of limits (of keys)
--   now       integer ms since the epoch (the caller's clock), or the
--             string TIME to read the server's clock (`clock: redis`; read
--             once per call, so a batch shares one instant)
--   then per limit i: algorithm (0 sliding_window, 1 fixed_window,
--             2 sliding_log, 3 gcra, 4 calendar month), limit L, window w
--             (ms, >= 1), cost c and burst B (gcra; ignored otherwise). For
--             a calendar month, w is the month's end (ms) and B its index.
--           Requests of one route at one instant share a shape, so a batch
--           sends each once.
-- then      per request, in order, the index (from 1) of its shape; the
--           request owns the next n keys of KEYS.
--
-- Returns an array with one entry per request, in order. A decided request
-- is a flat integer array
--   { allowed, admits_1, remaining_1, reset_ms_1, retry_after_ms_1, ... }
-- allowed/admits are 1 or 0; retry_after_ms is -1 when the limit can never
-- admit the request (c > L, or c > B for gcra). remaining and reset_ms are
-- the limit's state after the decision: with the cost taken when the
-- request is allowed, without it when it is denied, whichever limit denied
-- it. allowed = 1 only when every
-- limit admits, and only then is anything written: each key gets its new
-- state and an expiry at the instant nothing in it counts any more
-- (reset_ms; for fixed windows and gcra at least min(w, MIN_TTL), see
-- below), so idle
-- identities vanish. A denied request writes nothing
-- (a sliding log drops members that stopped counting; that changes no
-- decision).
--
-- A request that cannot be decided is a string instead, the error message
-- ("ERR tollgate limits: ..."), and writes nothing: a key holding anything
-- but a well-formed state (another type, garbage) or bad arguments for it.
-- It fails only that request, never a guessed decision, never the rest of
-- the batch. Arguments that do not split into requests as above are an
-- error reply for the whole call.
--
-- This mirrors src/limit/{sliding_window,fixed_window,sliding_log,gcra}.rs
-- number for number. Lua numbers are doubles, exact for integers below
-- 2^53; the configuration keeps 3 * max(L, B) * w below 2^53 and the script
-- answers an error rather than a wrong number if it sees more. Divisions go
-- through idiv/cdiv, which correct the rounded double quotient to the exact
-- integer one.


-- The message of a request that cannot be decided.
local function fail(msg)
  return 'ERR tollgate limits: ' .. msg
end

-- int, idiv, cdiv, str, now_ms and EXACT come from arith.lua, prepended.

-- The string at key, nil when absent, or an error reply.
local function get(key)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' and raw.err then
    return nil, fail(key .. ': ' .. raw.err)
  end
  return raw or nil, nil
end

-- Each algorithm returns admits, remaining, reset, retry and a write
-- function (called only when the whole request is admitted), or nil and an
-- error message.

local function sliding_window(key, now, l, w, c)
  local idx = idiv(now, w)
  local e = now - idx * w
  -- The stored counts, rolled forward to window idx (State::at).
  local prev, cur = 0, 0
  local widx = idx
  local raw, err = get(key)
  if err then
    return nil, err
  end
  if raw then
    local sw, sp, sc = string.match(raw, '^(%d+):(%d+):(%d+)$')
    local kw, kp, kc = int(sw), int(sp), int(sc)
    if sw == nil or kw == nil or kp == nil or kc == nil then
      return nil, fail(key .. ' does not hold a "<window>:<prev>:<cur>" counter')
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
    return nil, fail(key .. ': counts times window reach 2^53, beyond exact arithmetic')
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
  local value = str(widx) .. ':' .. str(prev) .. ':' .. str(cur_after)
  return admits, remaining, reset, retry, function()
    if reset > 0 then
      redis.call('SET', key, value, 'PX', str(reset))
    else
      -- Nothing left to decay (cost 0 on an empty counter): absent is the
      -- same state, and costs no memory.
      redis.call('DEL', key)
    end
  end
end

-- A fixed window: index idx for now, ending at end_of(widx) for the window
-- widx the count belongs to.
local function fixed(key, now, l, c, idx, end_of, min_ttl)
  local widx, count = idx, 0
  local raw, err = get(key)
  if err then
    return nil, err
  end
  if raw then
    local sw, sc = string.match(raw, '^(%d+):(%d+)$')
    local kw, kc = int(sw), int(sc)
    if sw == nil or kw == nil or kc == nil then
      return nil, fail(key .. ' does not hold a "<window>:<count>" counter')
    end
    if kw >= idx then
      widx, count = kw, kc
    end
  end
  local window_end = end_of(widx)
  if window_end >= EXACT or count + math.min(c, l) >= EXACT then
    return nil, fail(key .. ': window or count reach 2^53, beyond exact arithmetic')
  end
  local admits = c <= l and count + c <= l
  local after = count
  if admits then
    after = count + c
  end
  local to_end = math.max(0, window_end - now)
  local reset = 0
  if after > 0 then
    reset = to_end
  end
  local retry
  if admits then
    retry = 0
  elseif c > l then
    retry = -1
  else
    retry = to_end
  end
  local value = str(widx) .. ':' .. str(after)
  return admits, math.max(0, l - after), reset, retry, function()
    if reset > 0 then
      redis.call('SET', key, value, 'PX', str(math.max(reset, min_ttl)))
    else
      redis.call('DEL', key)
    end
  end
end

local function fixed_window(key, now, l, w, c)
  return fixed(key, now, l, c, idiv(now, w), function(widx)
    return (widx + 1) * w
  end, math.min(w, MIN_TTL))
end

-- A calendar month: the caller sends the month's end in the window slot and
-- its index (months since January 1970) in the burst slot, computed once in
-- Rust (src/limit/calendar.rs). State from a clock ahead is measured to the
-- end of now's month, as the in-process store does.
local function calendar_month(key, now, l, month_end, c, index)
  return fixed(key, now, l, c, index, function(_)
    return month_end
  end, MIN_TTL)
end

local function sliding_log(key, now, l, w, c)
  local kind = redis.call('TYPE', key).ok
  if kind ~= 'zset' and kind ~= 'none' then
    return nil, fail(key .. ' holds a ' .. kind .. ', not a sorted-set log')
  end
  if now >= w then
    -- Units at s <= now - w no longer count.
    redis.call('ZREMRANGEBYSCORE', key, '-inf', str(now - w))
  end
  local used = redis.call('ZCARD', key)
  local admits = c <= l and used + c <= l
  local after = used
  if admits then
    after = used + c
  end
  local newest = nil
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    newest = int(last[2])
    if newest == nil then
      return nil, fail(key .. ' holds a member whose score is not a time in ms')
    end
  end
  if admits and c > 0 then
    newest = math.max(newest or now, now)
  end
  local reset = 0
  if newest then
    reset = math.max(0, newest + w - now)
  end
  local retry
  if admits then
    retry = 0
  elseif c > l then
    retry = -1
  else
    -- The k-th oldest unit must leave, k = used - (L - c) >= 1.
    local k = used - (l - c)
    local kth = redis.call('ZRANGE', key, k - 1, k - 1, 'WITHSCORES')
    local s = int(kth[2])
    if s == nil then
      return nil, fail(key .. ' holds a member whose score is not a time in ms')
    end
    retry = math.max(0, s + w - now)
  end
  return admits, math.max(0, l - after), reset, retry, function()
    if c == 0 then
      return
    end
    log_add(key, now, c)
    redis.call('PEXPIRE', key, str(reset))
  end
end

local function gcra(key, now, l, w, c, b)
  -- A limit of 0 (refused by the configuration) counts as 1, as in gcra.rs.
  l = math.max(l, 1)
  local tat, rem = 0, 0
  local raw, err = get(key)
  if err then
    return nil, err
  end
  if raw then
    local st, sr = string.match(raw, '^(%d+):(%d+)$')
    tat, rem = int(st), int(sr)
    if st == nil or tat == nil or rem == nil then
      return nil, fail(key .. ' does not hold a "<tat>:<rem>" arrival time')
    end
  end
  if rem >= l then
    -- The limit was lowered since this was written: round up (gcra.rs).
    tat, rem = tat + 1, 0
  end
  local base_ms, base_rem = now, 0
  if tat > now or (tat == now and rem > 0) then
    base_ms, base_rem = tat, rem
  end
  if b * w * 3 >= EXACT or (base_ms - now) * l + base_rem + math.min(c, b) * w >= EXACT then
    return nil, fail(key .. ': burst times window reach 2^53, beyond exact arithmetic')
  end
  -- Everything in units of 1/L ms, where one unit of cost is exactly w.
  local diff = (base_ms - now) * l + base_rem
  local cap = b * w
  local admits = c <= b and diff + c * w <= cap
  local diff_after = diff
  if admits then
    diff_after = diff + c * w
  end
  local remaining = 0
  if cap > diff_after then
    remaining = idiv(cap - diff_after, w)
  end
  local reset = cdiv(diff_after, l)
  local retry
  if admits then
    retry = 0
  elseif c > b then
    retry = -1
  else
    retry = cdiv(diff + c * w - cap, l)
  end
  return admits, remaining, reset, retry, function()
    local total = base_rem + c * w
    local q = idiv(total, l)
    local value = str(base_ms + q) .. ':' .. str(total - q * l)
    if reset > 0 then
      redis.call('SET', key, value, 'PX', str(math.max(reset, math.min(w, MIN_TTL))))
    else
      redis.call('DEL', key)
    end
  end
end

local ALGORITHMS = {
  [0] = sliding_window,
  [1] = fixed_window,
  [2] = sliding_log,
  [3] = gcra,
  [4] = calendar_month,
}

-- Decides one request: its n limits are KEYS[k + 1 .. k + n] and
-- ARGV[a + 1 .. a + 5n]. Returns the reply array, or nil and an error
-- message.
local function decide(k, n, now, a)
  local reply = { 1 }
  local writes = {}
  local allowed = true
  for i = 1, n do
    local key = KEYS[k + i]
    local base = a + 5 * (i - 1)
    local alg = int(ARGV[base + 1])
    local l = int(ARGV[base + 2])
    local w = int(ARGV[base + 3])
    local c = int(ARGV[base + 4])
    local b = int(ARGV[base + 5])
    if alg == nil or ALGORITHMS[alg] == nil then
      return nil, fail('unknown algorithm for ' .. key)
    end
    if l == nil or w == nil or c == nil or b == nil or w == 0 then
      return nil, fail('limit, window, cost and burst of ' .. key .. ' must be integers in [0, 2^53), window >= 1')
    end
    local admits, remaining, reset, retry, write = ALGORITHMS[alg](key, now, l, w, c, b)
    if admits == nil then
      return nil, remaining
    end
    if not admits then
      allowed = false
    end
    reply[#reply + 1] = admits and 1 or 0
    reply[#reply + 1] = remaining
    reply[#reply + 1] = reset
    reply[#reply + 1] = retry
    writes[i] = write
  end
  if not allowed then
    reply[1] = 0
    -- A denied request consumes nothing, so every limit shows its state
    -- without it. A limit that admitted answered with the request's cost
    -- taken: it answers again at cost 0, which writes nothing.
    for i = 1, n do
      local at = 2 + 4 * (i - 1)
      if reply[at] == 1 then
        local base = a + 5 * (i - 1)
        local admits, remaining, reset = ALGORITHMS[int(ARGV[base + 1])](
          KEYS[k + i], now, int(ARGV[base + 2]), int(ARGV[base + 3]), 0, int(ARGV[base + 5]))
        if admits == nil then
          return nil, remaining
        end
        reply[at + 1] = remaining
        reply[at + 2] = reset
      end
    end
    return reply
  end
  for i = 1, n do
    writes[i]()
  end
  return reply
end

-- TIME is read once per call: every request of a batch is decided at the
-- same server instant.
local server_now = nil
local function request_now(arg)
  if arg == 'TIME' then
    if server_now == nil then
      server_now = now_ms(arg)
    end
    return server_now
  end
  return int(arg)
end

local malformed = 'expected S, S shapes of 2 + 5 n arguments, then a shape index per request of n keys'
local shapes = {}
local a = 1
local count = int(ARGV[1])
if count == nil then
  return redis.error_reply(fail(malformed))
end
for s = 1, count do
  local n = int(ARGV[a + 1])
  if n == nil or a + 2 + 5 * n > #ARGV then
    return redis.error_reply(fail(malformed))
  end
  shapes[s] = { n = n, now = ARGV[a + 2], at = a + 2 }
  a = a + 2 + 5 * n
end

local replies = {}
local k = 0
for r = a + 1, #ARGV do
  local shape = shapes[int(ARGV[r])]
  if shape == nil or k + shape.n > #KEYS then
    return redis.error_reply(fail(malformed))
  end
  local now = request_now(shape.now)
  local reply, err
  if now == nil then
    err = fail('now must be an integer in [0, 2^53)')
  else
    reply, err = decide(k, shape.n, now, shape.at)
  end
  replies[#replies + 1] = reply or err
  k = k + shape.n
end
if k ~= #KEYS then
  return redis.error_reply(fail(malformed))
end
return replies
