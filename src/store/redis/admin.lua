-- The admin API's writes and reads of the overrides hash, and the
-- generation counter every gateway watches (src/store/redis/admin.rs).
--
-- KEYS[1]   the overrides hash: field = an override's id, value = its JSON
-- KEYS[2]   the generation counter (same slot: both carry `{admin}`)
-- ARGV[1]   the operation:
--   gen       returns the generation (0 when absent)
--   list      returns { generation, field1, value1, field2, value2, ... }
--   put       ARGV[2] field, ARGV[3] value: sets it, bumps the generation,
--             returns the value it replaced (nil when new)
--   del       ARGV[2] field: removes it, bumps the generation when it
--             was there, returns the value removed (nil when absent)
--   bump      bumps the generation (counters were reset), returns it

local op = ARGV[1]
local function gen()
  return tonumber(redis.call('GET', KEYS[2]) or '0') or 0
end
if op == 'gen' then
  return gen()
elseif op == 'list' then
  local out = { gen() }
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all do
    out[#out + 1] = all[i]
  end
  return out
elseif op == 'put' then
  local before = redis.call('HGET', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  redis.call('INCR', KEYS[2])
  return before
elseif op == 'del' then
  local before = redis.call('HGET', KEYS[1], ARGV[2])
  if before then
    redis.call('HDEL', KEYS[1], ARGV[2])
    redis.call('INCR', KEYS[2])
  end
  return before
elseif op == 'bump' then
  return redis.call('INCR', KEYS[2])
end
return redis.error_reply('tollgate admin: unknown operation')
