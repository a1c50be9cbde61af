-- A batch of requests, each decided with all its limits together
-- (docs/design.md#several-limits-on-one-request).
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
--             sliding_window with a precision
--                             hash, "<bucket>" -> units for each bucket
--                             floor(t/p) that admitted any, and "total",
--                             their sum
-- ARGV[1]   S, the number of shapes that follow. A shape is what a request
--           asks apart from its keys and its instant, 1 + 5 n arguments:
--   n         its number of limits (of keys)
--   then per limit i: algorithm (0 sliding_window, 1 fixed_window,
--             2 sliding_log, 3 gcra, 4 calendar month, 5 precision
--             buckets), limit L, window w (ms, >= 1), cost c and burst B
--             (gcra; ignored otherwise). For a calendar month, w is the
--             month's end (ms) and B its index; for precision buckets, B
--             is the precision p (ms).
--           Requests of one route share a shape, so a batch sends each
--           once.
-- then      runs of requests, in order, 3 arguments each:
--   shape     the index (from 1) of the requests' shape
--   now       their instant: integer ms since the epoch (the caller's
--             clock), or the string TIME to read the server's clock
--             (`clock: redis`; read once per call, so a batch shares one
--             instant)
--   count     how many requests in a row have this shape and instant; each
--           owns the next n keys of KEYS.
--           A batch's requests come from a few milliseconds, so it is a
--           few runs however many requests it holds.
--
-- Returns one flat array for the whole batch, request after request. A
-- decided request of n limits takes 1 + 4 n integers
--   allowed, admits_1, remaining_1, reset_ms_1, retry_after_ms_1, ...
-- allowed/admits are 1 or 0; retry_after_ms is -1 when the limit can never
-- admit the request (c > L, or c > B for gcra). remaining and reset_ms are
-- the limit's state after the decision: with the cost taken when the
-- request is allowed, without it when it is denied, whichever limit denied
-- it. allowed = 1 only when every limit admits, and only then is anything
-- written: each key gets its new state and an expiry at the instant
-- nothing in it counts any more (reset_ms; for fixed windows and gcra at
-- least min(w, MIN_TTL), see below), so idle identities vanish. A denied
-- request writes nothing (a sliding log drops members that stopped
-- counting; that changes no decision). The caller knows each request's n,
-- so it can split the array; one array of integers is also what is
-- cheapest for Redis to hand over.
--
-- A request that cannot be decided takes one entry instead, a string: the
-- error message ("ERR tollgate limits: ..."), and writes nothing: a key
-- holding anything but a well-formed state (another type, garbage) or bad
-- arguments for it. It fails only that request, never a guessed decision,
-- never the rest of the batch. Arguments that do not split into requests
-- as above are an error reply for the whole call.
--
-- Most requests have one or two sliding-window limits; a shape of those
-- takes a fast path (one_window, two_windows below) that computes the same
-- numbers as the general one with less work per request: the shape's
-- arguments are read once per call and its window index and elapsed time
-- once per run, each key is read (GET) and written (SET ... PX, or
-- KEEPTTL when it already counts this window: sw_write) once, and
-- nothing is built per request but the counter's new value (one
-- string.format) and its entries of the reply.
--
-- This mirrors src/limit/{sliding_window,fixed_window,sliding_log,gcra,buckets}.rs
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

-- The sliding window in three steps, so the fast paths can read both
-- limits of a request before deciding, and answer a limit again at cost 0
-- without reading it again.

-- Named once: each mention of a global such as string.match is two table
-- lookups, and the fast paths run these for every request.
local redis_call, redis_pcall = redis.call, redis.pcall
local match, format = string.match, string.format

-- The pattern of a counter written in the window whose index is idx_s:
-- its prev and cur captured.
local function window_pattern(idx_s)
  return '^' .. idx_s .. ':(%d+):(%d+)$'
end

-- The counts of key rolled forward to window idx (State::at), idx_s being
-- idx in decimal and pat its window_pattern: prev, cur, and the decimals
-- of the window they belong to and of prev, which a write puts back as
-- they are (turning numbers into text is among the dearest things a script
-- does); then keep, true when
-- the key already holds counts of this window (its expiry, the end of the
-- next window, is the one a write would set again), and ahead, how many
-- windows the key's window is past idx (a gateway ahead wrote it); or nil
-- and an error message.
local function sw_read(key, idx, idx_s, pat)
  local raw = redis_pcall('GET', key)
  if not raw then
    return 0, 0, idx_s, '0', false, 0
  end
  if type(raw) ~= 'string' then
    return nil, fail(key .. ': ' .. tostring(raw.err))
  end
  -- Written in this window, the common case: pat names the window, so two
  -- captures instead of three, and `+ 0` reads a decimal once where
  -- tonumber reads it twice.
  local sp, sc = match(raw, pat)
  if sp then
    -- Digits only, so each is an integer; exact below 2^53.
    local kp, kc = sp + 0, sc + 0
    if kp < EXACT and kc < EXACT then
      return kp, kc, idx_s, sp, kc > 0, 0
    end
  end
  local sw
  sw, sp, sc = match(raw, '^(%d+):(%d+):(%d+)$')
  local kw, kp, kc = tonumber(sw), tonumber(sp), tonumber(sc)
  if kw == nil or kw >= EXACT or kp >= EXACT or kc >= EXACT then
    return nil, fail(key .. ' does not hold a "<window>:<prev>:<cur>" counter')
  end
  if kw >= idx then
    -- kw > idx: a gateway whose clock is ahead wrote this; keep its
    -- window rather than resetting the counts (State::at).
    return kp, kc, sw, sp, false, kw - idx
  elseif kw + 1 == idx then
    return kc, 0, idx_s, sc, false, 0
  end
  return 0, 0, idx_s, '0', false, 0
end

-- sliding_window::check for cost c, e ms into the current window, on the
-- counts prev and cur: admits, remaining, reset, retry and the current
-- count after the decision; or nil and an error message.
local function sw_check(key, e, l, w, c, prev, cur)
  local least = c
  if l < c then
    least = l
  end
  local lw = l * w
  if lw >= EXACT or (prev + cur + least) * w >= EXACT then
    return nil, fail(key .. ': counts times window reach 2^53, beyond exact arithmetic')
  end
  -- Times w: E*w = prev*(w-e) + cur*w.
  local decayed = prev * (w - e)
  local admits = c <= l and decayed + (cur + c) * w <= lw
  local after = cur
  if admits then
    after = cur + c
  end
  local used = decayed + after * w
  local remaining = 0
  if lw > used then
    remaining = idiv(lw - used, w)
  end
  local reset = 0
  if after > 0 then
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
  return admits, remaining, reset, retry, after
end

-- Writes the counts (the window and prev as sw_read gave their decimals)
-- and the expiry reset ms away, in the key's window: extra ms later for a
-- key ahead of this clock. A key that already holds counts of this window
-- keeps its expiry instead (keep): the one set by the window's first write,
-- which every write of the window would set again but for the writers'
-- clocks — and renewing an expiry costs Redis about a microsecond.
local function sw_write(key, window_s, prev_s, cur, reset, keep, extra)
  if reset > 0 then
    local value = window_s .. ':' .. prev_s .. ':' .. format('%d', cur)
    if keep then
      redis_call('SET', key, value, 'KEEPTTL')
    else
      redis_call('SET', key, value, 'PX', str(reset + extra))
    end
  else
    -- Nothing left to decay (cost 0 on an empty counter): absent is the
    -- same state, and costs no memory.
    redis_call('DEL', key)
  end
end

-- The fast path of a request with one sliding-window limit, key, of limit
-- l, window w and cost c, at e ms into window idx (idx_s in decimal, pat
-- the pattern of a counter of that window, see window_pattern); appends
-- its answer to out from o + 1 and returns the new end.
local function one_window(key, l, w, c, idx, idx_s, pat, e, out, o)
  local prev, cur, window_s, prev_s, keep, ahead = sw_read(key, idx, idx_s, pat)
  if prev == nil then
    out[o + 1] = cur
    return o + 1
  end
  local admits, remaining, reset, retry, after = sw_check(key, e, l, w, c, prev, cur)
  if admits == nil then
    out[o + 1] = remaining
    return o + 1
  end
  local flag = 0
  if admits then
    flag = 1
    sw_write(key, window_s, prev_s, after, reset, keep, ahead * w)
  end
  -- Denied, the one limit already answered without the cost.
  out[o + 1] = flag
  out[o + 2] = flag
  out[o + 3] = remaining
  out[o + 4] = reset
  out[o + 5] = retry
  return o + 5
end

-- The fast path of a request with two sliding-window limits, as decide
-- answers it: both read and decided, both written only when both admit,
-- and on a deny the limit that admitted answers again at cost 0. at holds
-- the window index, its decimal and the elapsed time of each limit: idx1,
-- idx1_s, e1, idx2, idx2_s, e2.
local function two_windows(key1, key2, sh, at, out, o)
  local l1, wl1, cost1, l2, wl2, cost2 = sh.l1, sh.w1, sh.c1, sh.l2, sh.w2, sh.c2
  local p1, c1, w1, ps1, keep1, ahead1 = sw_read(key1, at[1], at[2], at[7])
  if p1 == nil then
    out[o + 1] = c1
    return o + 1
  end
  local a1, rem1, res1, ret1, after1 = sw_check(key1, at[3], l1, wl1, cost1, p1, c1)
  if a1 == nil then
    out[o + 1] = rem1
    return o + 1
  end
  local p2, c2, w2, ps2, keep2, ahead2 = sw_read(key2, at[4], at[5], at[8])
  if p2 == nil then
    out[o + 1] = c2
    return o + 1
  end
  local a2, rem2, res2, ret2, after2 = sw_check(key2, at[6], l2, wl2, cost2, p2, c2)
  if a2 == nil then
    out[o + 1] = rem2
    return o + 1
  end
  local _
  if a1 and a2 then
    sw_write(key1, w1, ps1, after1, res1, keep1, ahead1 * wl1)
    sw_write(key2, w2, ps2, after2, res2, keep2, ahead2 * wl2)
    out[o + 1] = 1
  else
    if a1 then
      _, rem1, res1 = sw_check(key1, at[3], l1, wl1, 0, p1, c1)
    end
    if a2 then
      _, rem2, res2 = sw_check(key2, at[6], l2, wl2, 0, p2, c2)
    end
    out[o + 1] = 0
  end
  out[o + 2] = a1 and 1 or 0
  out[o + 3] = rem1
  out[o + 4] = res1
  out[o + 5] = ret1
  out[o + 6] = a2 and 1 or 0
  out[o + 7] = rem2
  out[o + 8] = res2
  out[o + 9] = ret2
  return o + 9
end

-- The general path: every algorithm, any number of limits, one request
-- at a time (decide). Built on the first request that needs it: a script's
-- local functions are created anew on every call, and most calls never
-- take this path.
local function general()
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
    local prev, cur, window_s, prev_s, keep, ahead = sw_read(key, idx, str(idx), window_pattern(str(idx)))
    if prev == nil then
      return nil, cur
    end
    local admits, remaining, reset, retry, after = sw_check(key, e, l, w, c, prev, cur)
    if admits == nil then
      return nil, remaining
    end
    return admits, remaining, reset, retry, function()
      sw_write(key, window_s, prev_s, after, reset, keep, ahead * w)
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
      gcra_store(key, base_ms, base_rem + c * w, l, w, reset)
    end
  end

  -- Precision buckets of p ms (sent in the burst slot): bucket floor(t/p)
  -- counts while (b + 1) * p + w > now (src/limit/buckets.rs).
  local function buckets(key, now, l, w, c, p)
    if p == 0 then
      return nil, fail('precision of ' .. key .. ' must be at least 1 ms')
    end
    local list, total = bk_read(key, now, w, p)
    if list == nil then
      return nil, fail(total)
    end
    if total + math.min(c, l) >= EXACT then
      return nil, fail(key .. ': count reaches 2^53, beyond exact arithmetic')
    end
    local admits = c <= l and total + c <= l
    local after = total
    local cur = idiv(now, p)
    local newest = nil
    if #list > 0 then
      newest = list[#list][1]
    end
    if admits then
      after = total + c
      if c > 0 then
        newest = math.max(newest or cur, cur)
      end
    end
    local reset = 0
    if newest then
      reset = math.max(0, (newest + 1) * p + w - now)
    end
    local retry
    if admits then
      retry = 0
    elseif c > l then
      retry = -1
    else
      -- The oldest buckets leave first: the first whose leaving makes room.
      local left = total
      for i = 1, #list do
        left = left - list[i][2]
        if left + c <= l then
          retry = math.max(0, (list[i][1] + 1) * p + w - now)
          break
        end
      end
    end
    return admits, math.max(0, l - after), reset, retry, function()
      if c == 0 and #list > 0 then
        return
      end
      bk_add(list, cur, c)
      bk_store(key, now, w, p, list)
    end
  end

  local ALGORITHMS = {
    [0] = sliding_window,
    [1] = fixed_window,
    [2] = sliding_log,
    [3] = gcra,
    [4] = calendar_month,
    [5] = buckets,
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

  return decide
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
  return num(arg)
end

-- Limit i of the shape whose arguments start after ARGV[at], when it is a
-- sliding window with usable numbers: l, w, c; nil otherwise (the general
-- path then answers, with its errors).
local function fast_limit(at, i)
  local base = at + 5 * (i - 1)
  local l, w, c = num(ARGV[base + 2]), num(ARGV[base + 3]), num(ARGV[base + 4])
  if ARGV[base + 1] == '0' and l and w and c and num(ARGV[base + 5]) and w > 0 then
    return l, w, c
  end
  return nil
end

local malformed = 'expected S, S shapes of 1 + 5 n arguments, then runs of shape index, now and count of requests of n keys each'
local shapes = {}
local a = 1
local count = num(ARGV[1])
if count == nil then
  return redis.error_reply(fail(malformed))
end
for s = 1, count do
  local n = num(ARGV[a + 1])
  if n == nil or a + 1 + 5 * n > #ARGV then
    return redis.error_reply(fail(malformed))
  end
  -- Every field at once: a table grown field by field is rehashed as it grows.
  local sh = { n = n, at = a + 1, fast = 0, l1 = 0, w1 = 0, c1 = 0, l2 = 0, w2 = 0, c2 = 0 }
  if n == 1 or n == 2 then
    local l1, w1, c1 = fast_limit(sh.at, 1)
    local l2, w2, c2
    if l1 and n == 2 then
      l2, w2, c2 = fast_limit(sh.at, 2)
    end
    if l1 and (n == 1 or l2) then
      sh.l1, sh.w1, sh.c1, sh.l2, sh.w2, sh.c2 = l1, w1, c1, l2, w2, c2
      sh.fast = n
    end
  end
  shapes[s] = sh
  a = a + 1 + 5 * n
end

local decide = nil
local keys = #KEYS
local out, o = {}, 0
local k = 0
local at = {}
if (#ARGV - a) % 3 ~= 0 then
  return redis.error_reply(fail(malformed))
end
for r = a + 1, #ARGV, 3 do
  local sh, now, run = shapes[num(ARGV[r])], request_now(ARGV[r + 1]), num(ARGV[r + 2])
  if sh == nil or run == nil or k + run * sh.n > keys then
    return redis.error_reply(fail(malformed))
  end
  if now == nil then
    for _ = 1, run do
      o = o + 1
      out[o] = fail('now must be an integer in [0, 2^53)')
    end
    k = k + run * sh.n
  elseif sh.fast == 1 then
    local l, w, c = sh.l1, sh.w1, sh.c1
    local idx = idiv(now, w)
    local idx_s, e = str(idx), now - idx * w
    local pat = window_pattern(idx_s)
    for _ = 1, run do
      k = k + 1
      o = one_window(KEYS[k], l, w, c, idx, idx_s, pat, e, out, o)
    end
  elseif sh.fast == 2 then
    at[1] = idiv(now, sh.w1)
    at[2] = str(at[1])
    at[3] = now - at[1] * sh.w1
    at[4] = idiv(now, sh.w2)
    at[5] = str(at[4])
    at[6] = now - at[4] * sh.w2
    at[7] = window_pattern(at[2])
    at[8] = window_pattern(at[5])
    for _ = 1, run do
      o = two_windows(KEYS[k + 1], KEYS[k + 2], sh, at, out, o)
      k = k + 2
    end
  else
    decide = decide or general()
    for _ = 1, run do
      local reply, err = decide(k, sh.n, now, sh.at)
      if reply then
        for i = 1, #reply do
          out[o + i] = reply[i]
        end
        o = o + #reply
      else
        o = o + 1
        out[o] = err
      end
      k = k + sh.n
    end
  end
end
if k ~= keys then
  return redis.error_reply(fail(malformed))
end
return out
