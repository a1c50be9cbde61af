-- Concurrency slots as leases: one sorted set per concurrency
-- limit and caller, whose members are the leases of the requests in flight.
--
-- KEYS[1..n]  the sorted sets: member = a lease id (`<instance>:<serial>`),
--             score = when the lease expires, in ms on the Redis server's
--             clock (so gateways with skewed clocks agree).
-- ARGV[1]     the operation: acquire, renew, release or count.
-- ARGV[2]     the lease time in ms (acquire, renew; ignored otherwise).
-- acquire:    one key; ARGV[3] the cap, ARGV[4] the lease id. Drops the
--             expired leases (a gateway that died without giving its slots
--             back), then adds this one when fewer than the cap remain.
--             Returns {1, held after} or {0, held}.
-- renew:      ARGV[2 + i] the lease id held in KEYS[i]. Pushes each lease's
--             expiry to now + lease time; a lease already expired and
--             dropped is not taken again (ZADD XX). Returns how many were
--             renewed.
-- release:    ARGV[2 + i] the lease id to remove from KEYS[i]. Returns how
--             many were removed.
-- count:      one key; the leases not expired.
--
-- Every write also sets the set to expire one lease time after it, so the
-- set of a caller with nothing in flight leaves nothing behind.

local op = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if op == 'count' then
  return redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%.0f', now), '+inf')
end

local lease = tonumber(ARGV[2])
if op ~= 'release' and (lease == nil or lease < 1) then
  return redis.error_reply('ERR tollgate lease: the lease time must be a positive number')
end

if op == 'acquire' then
  local cap = tonumber(ARGV[3])
  if cap == nil or cap < 1 then
    return redis.error_reply('ERR tollgate lease: the cap must be a positive number')
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
  local held = redis.call('ZCARD', KEYS[1])
  if held >= cap then
    return {0, held}
  end
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + lease), ARGV[4])
  redis.call('PEXPIRE', KEYS[1], string.format('%.0f', lease))
  return {1, held + 1}
end

if op == 'renew' then
  local renewed = 0
  local until_ = string.format('%.0f', now + lease)
  for i, key in ipairs(KEYS) do
    renewed = renewed + redis.call('ZADD', key, 'XX', 'CH', until_, ARGV[2 + i])
    redis.call('PEXPIRE', key, string.format('%.0f', lease))
  end
  return renewed
end

if op == 'release' then
  local removed = 0
  for i, key in ipairs(KEYS) do
    removed = removed + redis.call('ZREM', key, ARGV[2 + i])
  end
  return removed
end

return redis.error_reply('ERR tollgate lease: unknown operation')
