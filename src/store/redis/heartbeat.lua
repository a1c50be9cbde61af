-- Announces one gateway instance and counts the live ones (`on_error:
-- local` divides each limit by that count while Redis is away).
--
-- KEYS[1]   a sorted set: member = instance id, score = its last beat in
--           ms on the Redis server's clock (so gateways with skewed clocks
--           agree on who is alive).
-- ARGV[1]   this instance's id.
-- ARGV[2]   time to live in ms: a member whose last beat is older is gone.
--
-- Returns the number of live instances, this one included. The set expires
-- with its last member, so a fleet that stops leaves nothing behind.

local ttl = tonumber(ARGV[2])
if ttl == nil or ttl < 1 then
  return redis.error_reply('ERR tollgate heartbeat: ttl must be a positive number')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%.0f', now - ttl))
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', ttl))
return redis.call('ZCARD', KEYS[1])
