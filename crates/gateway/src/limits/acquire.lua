-- Admits one request against limits shared by every gateway: first the team's quota, then the
-- class's slots (C) and queue (Q). Nothing is written unless the request is admitted or queued,
-- so a refusal costs no cleanup. Time is Redis's own, so gateways' clocks need not agree.
--
-- Under fair share between teams (ARGV 15 = 1), the class's attained service per team is in the
-- hash KEYS 6: 's:'..team the service (weighted tokens) as of 't:'..team (ms), 'w:'..team the
-- team's weight. A grant charges the member's cost; a team that starts waiting is lifted to the
-- least service per weight of the teams waiting; a full queue pushes out the newest waiter of
-- the team holding the most of it for its weight, if that is more than this team would.
-- Members are 'gateway:n:cost:team' (see limits.rs), so that every script can read them.
--
-- KEYS: 1 slots (zset member -> lease expiry ms), 2 queue (zset member -> lane * 1e13 + due
--       ms), 3 team in flight (zset member -> lease expiry ms), 4 team requests (hash second ->
--       count), 5 team tokens (hash second -> tokens), 6 attained service (hash), 7 pushed out
--       (zset member -> expiry ms)
-- ARGV: 1 member, 2 C, 3 Q, 4 lane (0 critical, 1 standard, 2 sheddable), 5 most waiters ahead
--       before the predicted wait is too long ('': no prediction), 6 lease ttl ms, 7 Wq ms,
--       8 team max_parallel (0: none), 9 rpm (0: none), 10 tpm (0: none), 11 tokens to reserve,
--       12 team, 13 its weight, 14 its cost in weighted tokens, 15 fair share (1) or fifo (0),
--       16 the half-life of attained service ms, 17 ms until it is due (its TTFT objective, at
--       most Wq): a queued member scores lane * 1e13 + when it is due, so the queue serves the
--       earliest deadline first (a member waits at most Wq, so a score is never more than Wq
--       past its arrival and the trimming below still only takes the lost)
-- Returns {outcome, n, rpm used, tpm used, rpm reset ms, tpm reset ms, second}:
--   outcome 1 granted, 2 queued (n waiters ahead), 3 queue full (n waiting), 4 shed,
--   5 predicted wait too long (n ahead), 10 over max_parallel, 11 over rpm (n ms to wait),
--   12 over tpm (n ms to wait; -1 never: more than a minute's worth)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local second = tonumber(t[1])
local member = ARGV[1]
local c, q, lane = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local max_ahead, ttl, wq = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local max_parallel, rpm, tpm, tokens =
  tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local LANE = 1e13
local team, weight, cost = ARGV[12], tonumber(ARGV[13]), tonumber(ARGV[14])
local fair, half_life = ARGV[15] == '1', tonumber(ARGV[16])
local due_in = tonumber(ARGV[17]) or wq

-- A team's attained service now (decayed), and its weight.
local function service(name)
  local v = redis.call('HMGET', KEYS[6], 's:' .. name, 't:' .. name, 'w:' .. name)
  local s, at, w = tonumber(v[1]) or 0, tonumber(v[2]) or now, tonumber(v[3]) or 1
  return s * 0.5 ^ (math.max(now - at, 0) / half_life), w
end

local function set_service(name, s)
  redis.call('HSET', KEYS[6], 's:' .. name, math.max(s, 0), 't:' .. name, now)
end

-- The queue's waiters per team: {team -> {n = count, standard = newest standard member,
-- critical = newest critical member}}.
local function waiters_by_team()
  local teams = {}
  local all = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    local name = string.match(all[i], '^%x+:%d+:%d+:(.*)$') or ''
    local t = teams[name]
    if not t then
      t = {n = 0}
      teams[name] = t
    end
    t.n = t.n + 1
    if tonumber(all[i + 1]) >= LANE then t.standard = all[i] else t.critical = all[i] end
  end
  return teams
end

-- A window of one-second buckets over the last 60 s: its sum and its buckets, oldest first,
-- dropping those that left it.
local function window(key)
  local fields = redis.call('HGETALL', key)
  local buckets, sum = {}, 0
  for i = 1, #fields, 2 do
    local s, v = tonumber(fields[i]), tonumber(fields[i + 1])
    if s <= second - 60 then
      redis.call('HDEL', key, fields[i])
    else
      sum = sum + v
      buckets[#buckets + 1] = {s, v}
    end
  end
  table.sort(buckets, function(a, b) return a[1] < b[1] end)
  return sum, buckets
end

-- The ms until a window's sum falls to `target` or below as its oldest buckets leave.
local function until_at_most(sum, buckets, target)
  local left, wait = sum, 0
  for _, b in ipairs(buckets) do
    if left <= target then break end
    left = left - b[2]
    wait = (b[1] + 60) * 1000 - now
  end
  return math.max(wait, 0)
end

local rpm_used, tpm_used, rpm_reset, tpm_reset = 0, 0, 0, 0
if max_parallel > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= max_parallel then
    return {10, max_parallel, 0, 0, 0, 0, second}
  end
end
if rpm > 0 then
  local buckets
  rpm_used, buckets = window(KEYS[4])
  if rpm_used + 1 > rpm then
    local wait = until_at_most(rpm_used, buckets, rpm - 1)
    return {11, wait, rpm_used, 0, wait, 0, second}
  end
  -- After this request: when the oldest request leaves (this one's, a minute on, if alone).
  rpm_reset = 60000
  if #buckets > 0 then rpm_reset = until_at_most(rpm_used, buckets, rpm_used - 1) end
end
if tpm > 0 then
  if tokens > tpm then
    return {12, -1, rpm_used, 0, rpm_reset, 0, second}
  end
  local buckets
  tpm_used, buckets = window(KEYS[5])
  if tpm_used + tokens > tpm then
    local wait = until_at_most(tpm_used, buckets, tpm - tokens)
    return {12, wait, rpm_used, tpm_used, rpm_reset, wait, second}
  end
  -- After this request: when every token now counted has left the window.
  tpm_reset = 60000
end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], 0, now - wq - ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[2], LANE, LANE + now - wq - ttl)
local busy = redis.call('ZCARD', KEYS[1])
local waiting = redis.call('ZCARD', KEYS[2])
local ahead = waiting
if lane == 0 then ahead = redis.call('ZCOUNT', KEYS[2], 0, LANE - 1) end

local outcome = 1
if busy + ahead >= c then
  if lane == 2 then return {4, 0, rpm_used, tpm_used, rpm_reset, tpm_reset, second} end
  local teams
  if fair then
    teams = waiters_by_team()
    -- Served before it: its own waiters, and of each other team as many as its weight gives
    -- it meanwhile.
    local own = teams[team] and teams[team].n or 0
    local est = own
    for name, t in pairs(teams) do
      if name ~= team then
        local _, w = service(name)
        est = est + math.min(t.n, math.ceil((own + 1) * w / weight))
      end
    end
    if est < ahead then ahead = est end
  end
  local victim
  if waiting >= q then
    -- Under fair share, the team holding the most of the queue for its weight makes room.
    if fair then
      local mine, most = ((teams[team] and teams[team].n or 0) + 1) / weight, 0
      for name, t in pairs(teams) do
        if name ~= team then
          local _, w = service(name)
          local m = t.standard
          if not m and lane == 0 then m = t.critical end
          if m and t.n / w > mine and t.n / w > most then victim, most = m, t.n / w end
        end
      end
    end
    if not victim then return {3, waiting, rpm_used, tpm_used, rpm_reset, tpm_reset, second} end
  end
  if max_ahead and ahead > max_ahead then
    return {5, ahead, rpm_used, tpm_used, rpm_reset, tpm_reset, second}
  end
  if victim then
    redis.call('ZREM', KEYS[2], victim)
    redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now)
    redis.call('ZADD', KEYS[7], now + 60000, victim)
    redis.call('PEXPIRE', KEYS[7], 120000)
  end
  outcome = 2
  if fair and not teams[team] then
    -- A team that starts waiting: lifted to the least service per weight of those waiting.
    local floor
    for name in pairs(teams) do
      local s, w = service(name)
      if not floor or s / w < floor then floor = s / w end
    end
    if floor and floor * weight > service(team) then set_service(team, floor * weight) end
  end
  redis.call('ZADD', KEYS[2], math.min(lane, 1) * LANE + now + due_in, member)
else
  redis.call('ZADD', KEYS[1], now + ttl, member)
  ahead = 0
  if fair then set_service(team, service(team) + cost) end
end
if fair then
  redis.call('HSET', KEYS[6], 'w:' .. team, weight)
  redis.call('PEXPIRE', KEYS[6], 3600000)
end
-- Keys that are never touched again expire on their own (a route or team removed by a reload).
redis.call('PEXPIRE', KEYS[1], 3600000)
redis.call('PEXPIRE', KEYS[2], 3600000)
if max_parallel > 0 then
  redis.call('ZADD', KEYS[3], now + ttl + wq, member)
  redis.call('PEXPIRE', KEYS[3], 3600000)
end
if rpm > 0 then
  redis.call('HINCRBY', KEYS[4], second, 1)
  redis.call('PEXPIRE', KEYS[4], 120000)
  rpm_used = rpm_used + 1
end
if tpm > 0 then
  redis.call('HINCRBY', KEYS[5], second, tokens)
  redis.call('PEXPIRE', KEYS[5], 120000)
  tpm_used = tpm_used + tokens
end
return {outcome, ahead, rpm_used, tpm_used, rpm_reset, tpm_reset, second}
