-- A queued request takes a freed slot if it is among the first waiters that the free slots can
-- serve, so gateways hand slots out in one order: critical before standard, then by deadline
-- (the queue's score: see acquire.lua), or under fair share between teams (ARGV 5 = 1), the team
-- with the least attained service per weight first (ties by deadline), each pick charging its
-- team as the grant will (acquire.lua has the service hash).
--
-- Waiters among those the free slots would go to whose gateway is no longer live (it died, or
-- lost Redis and cannot take its place back) leave the line, so that they do not hold it up
-- until their places expire.
--
-- KEYS: 1 slots, 2 queue, 3 the live gateways (as in renew.lua), 4 attained service, 5 pushed out
--       (as in acquire.lua), 6 the picks of the last state seen (hash: version, picks)
-- ARGV: 1 member, 2 C, 3 lease ttl ms, 4 Wq ms, 5 fair share (1) or fifo (0), 6 the half-life
--       of attained service ms
-- Returns 1 granted, 0 still waiting, -1 no longer queued (expired or removed), -2 pushed out of
-- a full queue by a team holding less of it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member, c, ttl, wq = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local fair, half_life = ARGV[5] == '1', tonumber(ARGV[6])
local LANE = 1e13
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], 0, now - wq - ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[2], LANE, LANE + now - wq - ttl)
local rank = redis.call('ZRANK', KEYS[2], member)
if not rank then
  if redis.call('ZSCORE', KEYS[5], member) then
    redis.call('ZREM', KEYS[5], member)
    return -2
  end
  return -1
end
local free = c - redis.call('ZCARD', KEYS[1])
if free <= 0 then return 0 end

local function live(m)
  local gateway = string.match(m, '^(%x+):')
  local expiry = gateway and redis.call('ZSCORE', KEYS[3], gateway)
  return expiry and tonumber(expiry) >= now
end

local function grant(m)
  redis.call('ZREM', KEYS[2], m)
  redis.call('ZADD', KEYS[1], now + ttl, m)
end

if not fair then
  -- Only the waiters the free slots would go to: a dead one further back leaves when it gets
  -- there, and no call reads the whole line.
  if rank >= free then
    for _, m in ipairs(redis.call('ZRANGE', KEYS[2], 0, free - 1)) do
      if not live(m) then
        redis.call('ZREM', KEYS[2], m)
        rank = rank - 1
      end
    end
  end
  if rank < free then
    grant(member)
    return 1
  end
  return 0
end

-- Fair share. The picks the free slots would go to are computed once for a state of the class
-- (its free slots and waiters) and kept briefly in KEYS 6, so that the other waiters asking
-- after the same release read them instead of each reading the whole queue again.
local waiting = redis.call('ZCARD', KEYS[2])
local version = free .. ':' .. waiting
local cached = redis.call('HMGET', KEYS[6], 'version', 'picks')
local picks
if cached[1] == version and cached[2] then
  picks = {}
  for m in string.gmatch(cached[2], '[^\n]+') do picks[#picks + 1] = m end
else
  -- The waiters of each lane by team, oldest first.
  local lanes = {{}, {}}
  local all = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    local m = all[i]
    local lane = 1
    if tonumber(all[i + 1]) >= LANE then lane = 2 end
    local name = string.match(m, '^%x+:%d+:%d+:(.*)$') or ''
    local q = lanes[lane][name]
    if not q then
      q = {first = 1}
      lanes[lane][name] = q
    end
    q[#q + 1] = {m, tonumber(all[i + 1])}
  end
  local service = {}
  local function team_service(name)
    local s = service[name]
    if not s then
      local v = redis.call('HMGET', KEYS[4], 's:' .. name, 't:' .. name, 'w:' .. name)
      local at = tonumber(v[2]) or now
      s = {
        v = (tonumber(v[1]) or 0) * 0.5 ^ (math.max(now - at, 0) / half_life),
        w = tonumber(v[3]) or 1,
      }
      service[name] = s
    end
    return s
  end
  -- Picks as the free slots would go: each charges its team what the grant will.
  picks = {}
  while #picks < free do
    local best, best_key, best_at, best_name
    for lane = 1, 2 do
      for name, q in pairs(lanes[lane]) do
        local w = q[q.first]
        if w then
          local s = team_service(name)
          local key = s.v / s.w
          if not best or key < best_key or (key == best_key and w[2] < best_at) then
            best, best_key, best_at, best_name = w[1], key, w[2], name
          end
        end
      end
      if best then
        local q = lanes[lane][best_name]
        q.first = q.first + 1
        break
      end
    end
    if not best then break end
    if live(best) then
      picks[#picks + 1] = best
      local s = team_service(best_name)
      s.v = s.v + (tonumber(string.match(best, '^%x+:%d+:(%d+):')) or 0)
    else
      redis.call('ZREM', KEYS[2], best)
      waiting = waiting - 1
    end
  end
  version = free .. ':' .. waiting
end

local mine
for k, m in ipairs(picks) do
  if m == member then mine = k end
end
if not mine then
  redis.call('HSET', KEYS[6], 'version', version, 'picks', table.concat(picks, '\n'))
  redis.call('PEXPIRE', KEYS[6], 100)
  return 0
end
grant(member)
local name = string.match(member, '^%x+:%d+:%d+:(.*)$') or ''
local cost = tonumber(string.match(member, '^%x+:%d+:(%d+):')) or 0
local v = redis.call('HMGET', KEYS[4], 's:' .. name, 't:' .. name)
local at = tonumber(v[2]) or now
local s = (tonumber(v[1]) or 0) * 0.5 ^ (math.max(now - at, 0) / half_life)
redis.call('HSET', KEYS[4], 's:' .. name, s + cost, 't:' .. name, now)
-- The others keep their picks for the state this grant leaves.
table.remove(picks, mine)
redis.call('HSET', KEYS[6], 'version', (free - 1) .. ':' .. (waiting - 1), 'picks', table.concat(picks, '\n'))
redis.call('PEXPIRE', KEYS[6], 100)
return 1
