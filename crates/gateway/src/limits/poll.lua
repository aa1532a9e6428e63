-- A gateway's backstop for one class where it has waiters, once in a while: free slots that no
-- call saw free (leases that expired) are handed off, and, after its subscription to its own
-- channel broke, where its waiters stand (a message may have been lost).
--
-- KEYS: 1-6 as in class.lua
-- ARGV: 1-7 as in class.lua, then the members to look up
-- Returns, for each member looked up: 1 granted, 0 still waiting, -1 no longer queued (expired
-- or removed), -2 pushed out of a full queue by a team holding less of it.
trim_queue()
hand_off()
local out = {}
for i = 8, #ARGV do
  local m = ARGV[i]
  if redis.call('ZSCORE', SLOTS, m) then
    out[#out + 1] = 1
  elseif redis.call('ZSCORE', QUEUE, m) then
    out[#out + 1] = 0
  elseif redis.call('ZSCORE', PUSHED, m) then
    redis.call('ZREM', PUSHED, m)
    out[#out + 1] = -2
  else
    out[#out + 1] = -1
  end
end
return out
