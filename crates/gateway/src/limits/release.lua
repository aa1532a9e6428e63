-- A request ends (or gives up waiting): its slot, queue place and team slot go back, its reserved
-- tokens are settled with what it really cost, so is its team's attained service under fair share
-- (its grant charged what it might cost), and a freed slot is handed to the next waiter
-- (class.lua), whose gateway alone is told.
--
-- KEYS: 1-6 as in class.lua, 7 team in flight, 8 team tokens (as in acquire.lua)
-- ARGV: 1-7 as in class.lua, 8 member, 9 second it was charged, 10 tokens reserved, 11 tokens
--       used (-1: unknown, the reservation stands), 12 team, 13 service charged, 14 service used
--       (-1: unknown, or not fair share), 15 ms since the slot was granted (the charge has
--       decayed since, as the team's service has)
-- Returns 1 if a slot was freed.
local member, charged_second = ARGV[8], tonumber(ARGV[9])
local charged, used = tonumber(ARGV[10]), tonumber(ARGV[11])
local freed = redis.call('ZREM', SLOTS, member)
unqueue(member)
redis.call('ZREM', KEYS[7], member)
if used >= 0 and used ~= charged and charged_second > second - 60
    and redis.call('HEXISTS', KEYS[8], charged_second) == 1 then
  if redis.call('HINCRBY', KEYS[8], charged_second, used - charged) < 0 then
    redis.call('HSET', KEYS[8], charged_second, 0)
  end
end
local team, service_charged, service_used = ARGV[12], tonumber(ARGV[13]), tonumber(ARGV[14])
if freed == 1 and service_used >= 0 and redis.call('HEXISTS', SERVICE, 's:' .. team) == 1 then
  local s = service(team)
  local charge_left = service_charged * 0.5 ^ (tonumber(ARGV[15]) / HALF_LIFE)
  set_service(team, s + service_used - charge_left)
end
if freed == 1 then hand_off() end
return freed
