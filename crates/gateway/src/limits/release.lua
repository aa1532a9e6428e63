-- A request ends: its slot, queue place and team slot go back, its reserved tokens are settled
-- with what it really cost, and gateways with waiters are told that a slot is free.
--
-- KEYS: 1 slots, 2 queue, 3 team in flight, 4 team tokens (as in acquire.lua)
-- ARGV: 1 member, 2 second it was charged, 3 tokens reserved, 4 tokens used (-1: unknown, the
--       reservation stands), 5 channel, 6 message
-- Returns 1 if a slot was freed.
local t = redis.call('TIME')
local member, second = ARGV[1], tonumber(ARGV[2])
local charged, used = tonumber(ARGV[3]), tonumber(ARGV[4])
local freed = redis.call('ZREM', KEYS[1], member)
redis.call('ZREM', KEYS[2], member)
redis.call('ZREM', KEYS[3], member)
if used >= 0 and used ~= charged and second > tonumber(t[1]) - 60
    and redis.call('HEXISTS', KEYS[4], second) == 1 then
  if redis.call('HINCRBY', KEYS[4], second, used - charged) < 0 then
    redis.call('HSET', KEYS[4], second, 0)
  end
end
if freed == 1 then redis.call('PUBLISH', ARGV[5], ARGV[6]) end
return freed
