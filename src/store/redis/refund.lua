-- Gives back what an earlier call of limits.lua consumed, when a
-- request's limits sit in several Redis Cluster slots and a limit decided
-- in a later slot denied it (see cluster.rs for the order and the bound).
--
-- KEYS[i]   a counter "<window>:<prev>:<cur>" written by limits.lua (sliding_window);
--           every key of one call shares a slot.
-- ARGV[1]   now as passed to the reserving call: integer ms, or TIME to
--           read the server's clock (`clock: redis`).
-- ARGV[2i], ARGV[2i+1]
--           window w (ms) and cost c of KEYS[i].
--
-- The reservation went into window R = floor(now / w). If the key still
-- holds window R, its current count loses c; if a later write rolled it to
-- R + 1, the reserved units sit in its previous count, which loses c.
-- Otherwise (absent, expired, older, or two windows on) nothing is left to
-- give back. Counts never go below 0; the expiry is kept (KEEPTTL).
--
-- Returns { now, window_1, prev_1, cur_1, ... }: the instant the refund
-- was made at (ARGV[1], or the server's TIME) and, per key, its counter as
-- the refund leaves it (0, 0, 0 when the key is absent), from which the
-- caller shows the limit without the refused request. Garbage in a key is
-- an error reply.

-- int, idiv, str and now_ms come from arith.lua, prepended.

if #ARGV ~= 1 + 2 * #KEYS then
  return redis.error_reply('ERR tollgate refund: expected 1 + 2 * #KEYS arguments')
end
local now = now_ms(ARGV[1])
if now == nil then
  return redis.error_reply('ERR tollgate refund: now must be an integer')
end

local reply = { now }
for i = 1, #KEYS do
  local w = int(ARGV[2 * i])
  local c = int(ARGV[2 * i + 1])
  if w == nil or w == 0 or c == nil then
    return redis.error_reply('ERR tollgate refund: bad window or cost for ' .. KEYS[i])
  end
  local kw, kp, kc = 0, 0, 0
  local raw = redis.call('GET', KEYS[i])
  if raw then
    local sw, sp, sc = string.match(raw, '^(%d+):(%d+):(%d+)$')
    kw, kp, kc = int(sw), int(sp), int(sc)
    if kw == nil or kp == nil or kc == nil then
      return redis.error_reply('ERR tollgate refund: ' .. KEYS[i] .. ' does not hold a counter')
    end
    local r = idiv(now, w)
    local given = false
    if kw == r then
      kc, given = math.max(0, kc - c), true
    elseif kw == r + 1 then
      kp, given = math.max(0, kp - c), true
    end
    if given then
      redis.call('SET', KEYS[i], str(kw) .. ':' .. str(kp) .. ':' .. str(kc), 'KEEPTTL')
    end
  end
  reply[#reply + 1] = kw
  reply[#reply + 1] = kp
  reply[#reply + 1] = kc
end
return reply
