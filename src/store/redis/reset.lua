-- Resets counters: deletes every key given (all in one slot) and returns
-- how many existed. Used by the admin API's `DELETE /admin/callers`.
--
-- KEYS      the counter keys of one caller (one hash tag, so one slot)
-- ARGV      none

return redis.call('DEL', unpack(KEYS))
