-- A share's fingerprint: the first process to count on the share writes
-- its own; every process reads what is there and compares.
-- KEYS[1]: <prefix>{@<share>}definition
-- ARGV[1]: this process's fingerprint
-- ARGV[2]: how long the fingerprint lives, in ms (renewed by each check)
-- Returns the fingerprint Redis holds.
local have = redis.call('GET', KEYS[1])
if not have then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return have
