-- Settles one reservation: adds delta = actual - reserved to the
-- counter a decision of limits.lua reserved in, by the rules of
-- src/limit/settle.rs, which the in-process store applies (number for
-- number, the same clamps).
--
-- KEYS[1]   the limit's key, in the layout limits.lua writes for its
--           algorithm (sliding_window, fixed_window / calendar month, gcra).
-- ARGV[1]   now: integer ms, or TIME for the server's clock (`clock: redis`).
-- ARGV[2]   algorithm: 0 sliding_window, 1 fixed_window, 3 gcra, 4 calendar
--           month, 5 precision buckets (2, sliding_log, is refused by the
--           configuration).
-- ARGV[3]   limit L.        ARGV[4]  window w (ms).
-- ARGV[5]   elapsed: ms between the reservation and now on the gateway's
--           clock; the reservation's instant is now - elapsed, so with
--           `clock: redis` it is placed on the server's clock too.
-- ARGV[6]   delta, a signed integer, already within the bounds of
--           Settlement::bounded_delta.
-- ARGV[7]   calendar month only: the month index of the reservation;
-- ARGV[8]   of now; ARGV[9] the end (ms) of now's month. 0 otherwise.
-- ARGV[10]  gcra: the burst B; precision buckets (5): the precision p.
--           0 otherwise.
--
-- Windows: while the reservation's window R still counts (now's window,
-- or for a sliding window the one before) and the key holds it, its count
-- moves (sliding window: also when it has rolled to R + 1, where R's
-- count is the previous one); otherwise a refund gives nothing back and
-- an extra charge goes into the current window. Counts stay within
-- [0, max(L, count)]. GCRA: the arrival time moves by delta * w / L, never
-- before now, never past an empty bucket. A write that only moves a count
-- keeps the key's expiry (KEEPTTL); a charge into a new window sets the
-- expiry limits.lua would.
--
-- Returns 1 when the key changed, 0 when nothing was left to settle.
-- Garbage in the key or in the arguments is an error reply.

-- int, idiv, str, now_ms, EXACT, MIN_TTL and gcra_store come from
-- arith.lua, prepended.

local function fail(msg)
  return redis.error_reply('ERR tollgate settle: ' .. msg)
end

if #KEYS ~= 1 or #ARGV ~= 10 then
  return fail('expected 1 key and 10 arguments')
end
local key = KEYS[1]
local now = now_ms(ARGV[1])
local alg, l, w, elapsed = int(ARGV[2]), int(ARGV[3]), int(ARGV[4]), int(ARGV[5])
local delta = tonumber(ARGV[6])
local month_res, month_now, month_end = int(ARGV[7]), int(ARGV[8]), int(ARGV[9])
local b = int(ARGV[10])
if now == nil or alg == nil or l == nil or w == nil or w == 0 or elapsed == nil
    or delta == nil or delta ~= math.floor(delta) or math.abs(delta) >= EXACT
    or month_res == nil or month_now == nil or month_end == nil or b == nil then
  return fail('bad arguments')
end
local at = math.max(0, now - elapsed)

-- count + delta within [0, max(l, count)].
local function moved(count)
  local v = count + delta
  local top = math.max(l, count)
  if v < 0 then
    v = 0
  elseif v > top then
    v = top
  end
  return v
end

if alg == 0 then
  local r, ci = idiv(at, w), idiv(now, w)
  local kw, kp, kc = nil, 0, 0
  local raw = redis.call('GET', key)
  if raw then
    local sw, sp, sc = string.match(raw, '^(%d+):(%d+):(%d+)$')
    kw, kp, kc = int(sw), int(sp), int(sc)
    if kw == nil or kp == nil or kc == nil then
      return fail(key .. ' does not hold a "<window>:<prev>:<cur>" counter')
    end
  end
  -- R counts while it is now's window or the one before.
  local counts = r + 1 >= ci
  if counts and kw == r then
    kc = moved(kc)
  elseif counts and kw == r + 1 then
    kp = moved(kp)
  elseif delta > 0 then
    -- The reservation's window has gone: charge the current one, rolling
    -- the counts forward as limits.lua does (State::at).
    local i = math.max(ci, r)
    if kw == nil or kw + 1 < i then
      kw, kp, kc = i, 0, 0
    elseif kw + 1 == i then
      kw, kp, kc = i, kc, 0
    end
    kc = moved(kc)
    sw_store(key, now, w, kw, kp, kc)
    return 1
  else
    return 0
  end
  redis.call('SET', key, str(kw) .. ':' .. str(kp) .. ':' .. str(kc), 'KEEPTTL')
  return 1
elseif alg == 1 or alg == 4 then
  local r, ci = idiv(at, w), idiv(now, w)
  if alg == 4 then
    r, ci = month_res, month_now
  end
  local kw, kc = nil, 0
  local raw = redis.call('GET', key)
  if raw then
    local sw, sc = string.match(raw, '^(%d+):(%d+)$')
    kw, kc = int(sw), int(sc)
    if kw == nil or kc == nil then
      return fail(key .. ' does not hold a "<window>:<count>" counter')
    end
  end
  -- R counts while it is now's window.
  if r >= ci and kw == r then
    redis.call('SET', key, str(kw) .. ':' .. str(moved(kc)), 'KEEPTTL')
    return 1
  elseif delta > 0 then
    local i = math.max(ci, r)
    if kw == nil or kw < i then
      kw, kc = i, 0
    end
    local window_end, min_ttl = (kw + 1) * w, math.min(w, MIN_TTL)
    if alg == 4 then
      window_end, min_ttl = month_end, MIN_TTL
    end
    local ttl = math.max(window_end - now, min_ttl, 1)
    redis.call('SET', key, str(kw) .. ':' .. str(moved(kc)), 'PX', str(ttl))
    return 1
  end
  return 0
elseif alg == 3 then
  l = math.max(l, 1)
  local tat, rem = 0, 0
  local raw = redis.call('GET', key)
  if raw then
    local st, sr = string.match(raw, '^(%d+):(%d+)$')
    tat, rem = int(st), int(sr)
    if st == nil or tat == nil or rem == nil then
      return fail(key .. ' does not hold a "<tat>:<rem>" arrival time')
    end
  end
  if rem >= l then
    tat, rem = tat + 1, 0
  end
  -- In units of 1/L ms after now, as limits.lua: held <= 0 is a full bucket.
  local held = 0
  if tat > now or (tat == now and rem > 0) then
    held = (tat - now) * l + rem
  end
  local target
  if delta > 0 then
    target = math.min(held + delta * w, math.max(b * w, held))
  elseif held > 0 then
    target = math.max(held + delta * w, 0)
  else
    return 0
  end
  if target >= EXACT then
    return fail(key .. ': arrival time beyond exact arithmetic')
  end
  gcra_store(key, now, target, l, w, idiv(target + l - 1, l))
  return 1
elseif alg == 5 then
  -- Precision buckets of b ms: the reservation's bucket moves while it
  -- counts and is held; otherwise a refund gives nothing back and a charge
  -- goes into now's bucket (src/limit/buckets.rs, settled).
  if b == 0 then
    return fail('bad arguments')
  end
  local list, err = bk_read(key, now, w, b)
  if list == nil then
    return fail(err)
  end
  local r = idiv(at, b)
  for i = 1, #list do
    if list[i][1] == r then
      list[i][2] = moved(list[i][2])
      bk_store(key, now, w, b, list)
      return 1
    end
  end
  if delta <= 0 then
    return 0
  end
  local i = math.max(idiv(now, b), r)
  local have = 0
  for j = 1, #list do
    if list[j][1] == i then
      have = list[j][2]
    end
  end
  bk_add(list, i, moved(have) - have)
  bk_store(key, now, w, b, list)
  return 1
end
return fail('algorithm ' .. ARGV[2] .. ' cannot be settled')
