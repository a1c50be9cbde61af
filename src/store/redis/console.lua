-- Publishes one gateway's console summary and reads the summaries of every
-- live gateway (the operators' console merges them into the fleet's view).
--
-- KEYS[1]   the heartbeat's sorted set of live instances (member = id,
--           score = last beat in ms on the server's clock).
-- KEYS[2]   a hash: field = instance id, value = its last summary (JSON,
--           opaque here). Same hash tag as KEYS[1], so one slot.
-- ARGV[1]   this instance's id.
-- ARGV[2]   its summary.
-- ARGV[3]   time to live in ms: an instance whose last beat is older is
--           gone, and its field is deleted.
--
-- Returns the summaries of the live instances, this one's included once
-- its heartbeat has been counted. The hash expires with the last
-- publisher, so a fleet that stops leaves nothing behind.

local ttl = tonumber(ARGV[3])
if ttl == nil or ttl < 1 then
  return redis.error_reply('ERR tollgate console: ttl must be a positive number')
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], string.format('%.0f', now - ttl), '+inf')) do
  live[id] = true
end
local out = {}
local fields = redis.call('HKEYS', KEYS[2])
for _, id in ipairs(fields) do
  if live[id] then
    out[#out + 1] = redis.call('HGET', KEYS[2], id)
  elseif id ~= ARGV[1] then
    redis.call('HDEL', KEYS[2], id)
  end
end
redis.call('PEXPIRE', KEYS[2], string.format('%.0f', ttl))
return out
