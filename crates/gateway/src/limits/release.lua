-- A request ends: its slot, queue place and team slot go back, its reserved tokens are settled
-- with what it really cost, so is its team's attained service under fair share (its grant charged
-- what it might cost), and gateways with waiters are told that a slot is free.
--
-- KEYS: 1 slots, 2 queue, 3 team in flight, 4 team tokens, 5 attained service (as in acquire.lua)
-- ARGV: 1 member, 2 second it was charged, 3 tokens reserved, 4 tokens used (-1: unknown, the
--       reservation stands), 5 channel, 6 message, 7 team, 8 service charged, 9 service used
--       (-1: unknown, or not fair share), 10 the half-life of attained service ms, 11 ms since the
--       slot was granted (the charge has decayed since, as the team's service has)
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
local team, service_charged, service_used = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
if freed == 1 and service_used >= 0 then
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local v = redis.call('HMGET', KEYS[5], 's:' .. team, 't:' .. team)
  if v[1] then
    local at = tonumber(v[2]) or now
    local s = tonumber(v[1]) * 0.5 ^ (math.max(now - at, 0) / tonumber(ARGV[10]))
    local charge_left = service_charged * 0.5 ^ (tonumber(ARGV[11]) / tonumber(ARGV[10]))
    s = math.max(s + service_used - charge_left, 0)
    redis.call('HSET', KEYS[5], 's:' .. team, s, 't:' .. team, now)
  end
end
if freed == 1 then redis.call('PUBLISH', ARGV[5], ARGV[6]) end
return freed
