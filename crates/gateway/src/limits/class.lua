-- A class's slots and queue, and the handoff of a freed slot: the head of every script that
-- touches them (limits.rs prepends it), so that each grants free slots to waiters the same way.
--
-- A freed slot is granted inside the call that sees it free (a release, an admission, a
-- gateway's backstop poll, or the trimming of an expired lease) to the next waiter in the class's
-- order, and only that waiter's gateway is told, on its own channel. Order: critical before
-- standard, then fifo by deadline (the queue's score), or under fair share the team with the
-- least attained service per weight (ties by deadline). Waiters of dead gateways and waiters past
-- their deadline are dropped on the way.
--
-- Fair share keeps, per lane, a sorted set of the teams waiting scored so that its order is the
-- order of their attained service per weight at any time (service decays by the same half-life
-- for every team: log2(s / w) + t / half_life does not change as time passes), and per lane and
-- team a sorted set of its waiters: a pick is O(log W + ties), not a read of the queue.
--
-- Members are 'gateway:n:cost:team' (see limits.rs), so that every script can read them.
--
-- KEYS (first six of every script): 1 slots (zset member -> lease expiry ms), 2 queue (zset
--       member -> lane * 1e13 + due ms), 3 live gateways (zset id -> expiry ms), 4 attained
--       service (hash: 's:'..team, 't:'..team, 'w:'..team), 5 pushed out (zset member -> expiry
--       ms), 6 deadlines (hash member -> ms after which a waiter is no longer waiting)
-- ARGV (first seven): 1 C, 2 lease ttl ms, 3 Wq ms, 4 fair share (1) or fifo (0), 5 the
--       half-life of attained service ms, 6 the prefix of the per-team queues, 7 the prefix of
--       the gateways' channels
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local second = tonumber(t[1])
local LANE = 1e13
local SLOTS, QUEUE, LIVE, SERVICE, PUSHED, UNTIL = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local C, TTL, WQ = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local FAIR, HALF_LIFE = ARGV[4] == '1', tonumber(ARGV[5])
local TQ, TO = ARGV[6], ARGV[7]
-- Below any real key: a team with no service yet.
local NO_SERVICE = -1e15

local function team_of(m) return string.match(m, '^%x+:%d+:%d+:(.*)$') or '' end
local function cost_of(m) return tonumber(string.match(m, '^%x+:%d+:(%d+):')) or 0 end
local function gateway_of(m) return string.match(m, '^(%x+):') or '' end
local function teams_key(lane) return TQ .. ':' .. lane end
local function team_queue(lane, name) return TQ .. ':' .. lane .. ':' .. name end

-- A team's attained service now (decayed), and its weight.
local function service(name)
  local v = redis.call('HMGET', SERVICE, 's:' .. name, 't:' .. name, 'w:' .. name)
  local s, at, w = tonumber(v[1]) or 0, tonumber(v[2]) or now, tonumber(v[3]) or 1
  return s * 0.5 ^ (math.max(now - at, 0) / HALF_LIFE), w
end

-- The score of a team among those waiting: ordered as service / weight, at any time.
local function order_of(s, w)
  if s <= 0 then return NO_SERVICE end
  return math.log(s / w) / math.log(2) + now / HALF_LIFE
end

-- Service per weight now from a team's score.
local function per_weight(score)
  if score <= NO_SERVICE then return 0 end
  return 2 ^ (score - now / HALF_LIFE)
end

local function set_service(name, s)
  s = math.max(s, 0)
  redis.call('HSET', SERVICE, 's:' .. name, s, 't:' .. name, now)
  if FAIR then
    local _, w = service(name)
    local score = order_of(s, w)
    redis.call('ZADD', teams_key(0), 'XX', score, name)
    redis.call('ZADD', teams_key(1), 'XX', score, name)
  end
end

local function live(m)
  local expiry = redis.call('ZSCORE', LIVE, gateway_of(m))
  return expiry and tonumber(expiry) >= now
end

local function tell(m, code)
  redis.call('PUBLISH', TO .. gateway_of(m), code .. ' ' .. now .. ' ' .. m)
end

-- Puts a waiter in the queue (and its team's, under fair share).
local function enqueue(m, lane, score, deadline)
  redis.call('ZADD', QUEUE, score, m)
  redis.call('HSET', UNTIL, m, deadline)
  redis.call('PEXPIRE', QUEUE, 3600000)
  redis.call('PEXPIRE', UNTIL, 3600000)
  if FAIR then
    local name = team_of(m)
    local q, teams = team_queue(lane, name), teams_key(lane)
    redis.call('ZADD', q, score, m)
    redis.call('PEXPIRE', q, 3600000)
    if not redis.call('ZSCORE', teams, name) then
      redis.call('ZADD', teams, order_of(service(name)), name)
    end
    redis.call('PEXPIRE', teams, 3600000)
  end
end

-- Takes a waiter out of the queue; its score, or nil if it was not waiting.
local function unqueue(m)
  local score = redis.call('ZSCORE', QUEUE, m)
  if not score then return nil end
  redis.call('ZREM', QUEUE, m)
  redis.call('HDEL', UNTIL, m)
  if FAIR then
    local lane = 0
    if tonumber(score) >= LANE then lane = 1 end
    local name = team_of(m)
    local q = team_queue(lane, name)
    redis.call('ZREM', q, m)
    if redis.call('ZCARD', q) == 0 then redis.call('ZREM', teams_key(lane), name) end
  end
  return score
end

-- The next waiter in the class's order, or nil.
local function pick()
  if not FAIR then
    return redis.call('ZRANGE', QUEUE, 0, 0)[1]
  end
  for lane = 0, 1 do
    local teams = teams_key(lane)
    while true do
      local first = redis.call('ZRANGE', teams, 0, 0, 'WITHSCORES')
      if not first[1] then break end
      -- Teams of equal service per weight (those with none yet, mostly): the earliest deadline.
      local tied = redis.call('ZRANGEBYSCORE', teams, first[2], first[2], 'LIMIT', 0, 64)
      local best, best_at
      for _, name in ipairs(tied) do
        local head = redis.call('ZRANGE', team_queue(lane, name), 0, 0, 'WITHSCORES')
        if not head[1] then
          redis.call('ZREM', teams, name)
        elseif not best or tonumber(head[2]) < best_at then
          best, best_at = head[1], tonumber(head[2])
        end
      end
      if best then return best end
    end
  end
  return nil
end

-- Grants a slot to a waiter and tells its gateway; under fair share it charges the team.
local function grant(m)
  unqueue(m)
  redis.call('ZADD', SLOTS, now + TTL, m)
  redis.call('PEXPIRE', SLOTS, 3600000)
  if FAIR then
    local name = team_of(m)
    set_service(name, service(name) + cost_of(m))
  end
  tell(m, 1)
end

-- Drops the places of waiters lost long ago (their gateway was cut off for longer than Wq), a
-- few per call.
local function trim_queue()
  if redis.call('EXISTS', QUEUE) == 0 then return end
  for _, lo in ipairs({0, LANE}) do
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', QUEUE, lo, lo + now - WQ - TTL, 'LIMIT', 0, 16)) do
      unqueue(m)
    end
  end
end

-- Hands every free slot to the next waiter in order: expired leases first go back. Returns how
-- many were granted.
local function hand_off()
  redis.call('ZREMRANGEBYSCORE', SLOTS, '-inf', now)
  -- Nobody waits (the common case when the class is not full): nothing more to read.
  if redis.call('EXISTS', QUEUE) == 0 then return 0 end
  local free = C - redis.call('ZCARD', SLOTS)
  local granted, dropped = 0, 0
  while free > 0 and dropped < 256 do
    local m = pick()
    if not m then break end
    local deadline = tonumber(redis.call('HGET', UNTIL, m))
    if not live(m) or (deadline and deadline <= now) then
      -- A dead gateway's waiter, or one whose time is up (its gateway gives up on its own).
      unqueue(m)
      dropped = dropped + 1
    else
      grant(m)
      free = free - 1
      granted = granted + 1
    end
  end
  return granted
end
