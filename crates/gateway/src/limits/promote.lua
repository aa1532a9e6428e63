-- A queued request takes a freed slot if it is among the first waiters that the free slots can
-- serve (critical before standard, then by arrival), so gateways hand slots out in one order.
--
-- Waiters ahead whose gateway is no longer live (it died, or lost Redis and cannot take its place
-- back) leave the line, so that they do not hold it up until their places expire.
--
-- KEYS: 1 slots, 2 queue (as in acquire.lua), 3 the live gateways (as in renew.lua)
-- ARGV: 1 member, 2 C, 3 lease ttl ms, 4 Wq ms
-- Returns 1 granted, 0 still waiting, -1 no longer queued (expired or removed).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member, c, ttl, wq = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local LANE = 1e13
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], 0, now - wq - ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[2], LANE, LANE + now - wq - ttl)
local rank = redis.call('ZRANK', KEYS[2], member)
if not rank then return -1 end
local free = c - redis.call('ZCARD', KEYS[1])
if rank >= free and free > 0 then
  for _, m in ipairs(redis.call('ZRANGE', KEYS[2], 0, rank - 1)) do
    local gateway = string.match(m, '^(%x+):')
    local expiry = gateway and redis.call('ZSCORE', KEYS[3], gateway)
    if not expiry or tonumber(expiry) < now then
      redis.call('ZREM', KEYS[2], m)
      rank = rank - 1
    end
  end
end
if rank < free then
  redis.call('ZREM', KEYS[2], member)
  redis.call('ZADD', KEYS[1], now + ttl, member)
  return 1
end
return 0
