-- Extends the leases one gateway holds, all in one call: a request that runs for ten minutes
-- keeps its slot, and a gateway that dies stops renewing, so its slots free within a lease ttl.
-- The gateway's own entry in the set of live gateways is a lease too: if it is gone, Redis lost
-- this gateway's leases (it restarted empty, or the gateway was cut off for longer than a ttl),
-- and they are all put back, with those of requests admitted while Redis was out.
--
-- KEYS: 1 the live gateways (zset id -> expiry ms), then the sets (slots or team in flight)
--       whose leases are renewed
-- ARGV: 1 lease ttl ms, 2 this gateway's id, 3 'add' to put back missing leases in any case,
--       then for each set, its count of members followed by
--       the members
-- Returns {1 if the leases were put back, the number of live gateways}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local expiry = now + ttl
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local lost = not redis.call('ZSCORE', KEYS[1], ARGV[2])
local add = lost or ARGV[3] == 'add'
redis.call('ZADD', KEYS[1], expiry, ARGV[2])
redis.call('PEXPIRE', KEYS[1], 3600000)
local i = 5
for k = 2, #KEYS do
  local n = tonumber(ARGV[i])
  i = i + 1
  local args = {}
  for j = 1, n do
    args[#args + 1] = expiry
    args[#args + 1] = ARGV[i]
    i = i + 1
    if #args >= 1000 or j == n then
      if add then
        redis.call('ZADD', KEYS[k], unpack(args))
      else
        -- Only leases Redis has: one released meanwhile must not come back.
        redis.call('ZADD', KEYS[k], 'XX', unpack(args))
      end
      args = {}
    end
  end
end
local since = tonumber(ARGV[4])
local live
if since > 0 then
  -- An entry scores its last renewal + ttl.
  live = redis.call('ZCOUNT', KEYS[1], since + ttl, '+inf')
else
  live = redis.call('ZCARD', KEYS[1])
end
local result = 0
if lost then result = 1 end
return {result, live, now}
