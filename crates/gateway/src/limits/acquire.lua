-- Admits one request against limits shared by every gateway: first the team's quota, then the
-- class's slots (C) and queue (Q). Free slots go first to those already waiting (class.lua's
-- hand_off: a lease that expired is granted here). Nothing is written for this request unless it
-- is admitted or queued, so a refusal costs no cleanup. Time is Redis's own, so gateways' clocks
-- need not agree.
--
-- Under fair share between teams, a grant charges the member's cost; a team that starts waiting
-- is lifted to the least service per weight of the teams waiting; a full queue pushes out the
-- newest waiter of the team holding the most of it for its weight, if that is more than this
-- team would, and tells that waiter's gateway.
--
-- KEYS: 1-6 as in class.lua, 7 team in flight (zset member -> lease expiry ms), 8 team requests
--       (hash second -> count), 9 team tokens (hash second -> tokens)
-- ARGV: 1-7 as in class.lua, 8 member, 9 Q, 10 lane (0 critical, 1 standard, 2 sheddable),
--       11 most waiters ahead before the predicted wait is too long ('': no prediction),
--       12 team max_parallel (0: none), 13 rpm (0: none), 14 tpm (0: none), 15 tokens to reserve,
--       16 team, 17 its weight, 18 its cost in weighted tokens, 19 ms until it is due (its TTFT
--       objective, at most Wq): a queued member scores lane * 1e13 + when it is due, so the
--       queue serves the earliest deadline first, 20 ms it may wait at most (its budget)
-- Returns {outcome, n, rpm used, tpm used, rpm reset ms, tpm reset ms, second}:
--   outcome 1 granted, 2 queued (n waiters ahead), 3 queue full (n waiting), 4 shed,
--   5 predicted wait too long (n ahead), 10 over max_parallel, 11 over rpm (n ms to wait),
--   12 over tpm (n ms to wait; -1 never: more than a minute's worth)
local member = ARGV[8]
local q, lane = tonumber(ARGV[9]), tonumber(ARGV[10])
local max_ahead = tonumber(ARGV[11])
local max_parallel, rpm, tpm, tokens =
  tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15])
local team, weight, cost = ARGV[16], tonumber(ARGV[17]), tonumber(ARGV[18])
local due_in = tonumber(ARGV[19]) or WQ
local budget = tonumber(ARGV[20]) or WQ

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
  redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now)
  if redis.call('ZCARD', KEYS[7]) >= max_parallel then
    return {10, max_parallel, 0, 0, 0, 0, second}
  end
end
if rpm > 0 then
  local buckets
  rpm_used, buckets = window(KEYS[8])
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
  tpm_used, buckets = window(KEYS[9])
  if tpm_used + tokens > tpm then
    local wait = until_at_most(tpm_used, buckets, tpm - tokens)
    return {12, wait, rpm_used, tpm_used, rpm_reset, wait, second}
  end
  -- After this request: when every token now counted has left the window.
  tpm_reset = 60000
end

trim_queue()
hand_off()
local busy = redis.call('ZCARD', SLOTS)
local waiting = redis.call('ZCARD', QUEUE)
local ahead = waiting
if lane == 0 then ahead = redis.call('ZCOUNT', QUEUE, 0, LANE - 1) end

-- Under fair share: the waiting teams (both lanes) with how many each has waiting.
local function waiting_teams()
  local teams = {}
  for l = 0, 1 do
    for _, name in ipairs(redis.call('ZRANGE', teams_key(l), 0, -1)) do
      teams[name] = (teams[name] or 0) + redis.call('ZCARD', team_queue(l, name))
    end
  end
  return teams
end

local outcome = 1
if busy + ahead >= C then
  if lane == 2 then return {4, 0, rpm_used, tpm_used, rpm_reset, tpm_reset, second} end
  local teams
  if FAIR then
    teams = waiting_teams()
    -- Served before it: its own waiters, and of each other team as many as its weight gives
    -- it meanwhile.
    local own = teams[team] or 0
    local est = own
    for name, n in pairs(teams) do
      if name ~= team then
        local _, w = service(name)
        est = est + math.min(n, math.ceil((own + 1) * w / weight))
      end
    end
    if est < ahead then ahead = est end
  end
  local victim
  if waiting >= q then
    -- Under fair share, the team holding the most of the queue for its weight makes room.
    if FAIR then
      local mine, most = ((teams[team] or 0) + 1) / weight, 0
      for name, n in pairs(teams) do
        if name ~= team then
          local _, w = service(name)
          local m = redis.call('ZRANGE', team_queue(1, name), -1, -1)[1]
          if not m and lane == 0 then m = redis.call('ZRANGE', team_queue(0, name), -1, -1)[1] end
          if m and n / w > mine and n / w > most then victim, most = m, n / w end
        end
      end
    end
    if not victim then return {3, waiting, rpm_used, tpm_used, rpm_reset, tpm_reset, second} end
  end
  if max_ahead and ahead > max_ahead then
    return {5, ahead, rpm_used, tpm_used, rpm_reset, tpm_reset, second}
  end
  if victim then
    unqueue(victim)
    redis.call('ZREMRANGEBYSCORE', PUSHED, '-inf', now)
    redis.call('ZADD', PUSHED, now + 60000, victim)
    redis.call('PEXPIRE', PUSHED, 120000)
    tell(victim, -2)
  end
  outcome = 2
  if FAIR and not teams[team] then
    -- A team that starts waiting: lifted to the least service per weight of those waiting.
    local floor
    for l = 0, 1 do
      local first = redis.call('ZRANGE', teams_key(l), 0, 0, 'WITHSCORES')
      if first[2] then
        local pw = per_weight(tonumber(first[2]))
        if not floor or pw < floor then floor = pw end
      end
    end
    if floor and floor * weight > service(team) then set_service(team, floor * weight) end
  end
  if FAIR then
    redis.call('HSET', SERVICE, 'w:' .. team, weight)
  end
  enqueue(member, math.min(lane, 1), math.min(lane, 1) * LANE + now + due_in, now + budget)
else
  redis.call('ZADD', SLOTS, now + TTL, member)
  ahead = 0
  if FAIR then
    redis.call('HSET', SERVICE, 'w:' .. team, weight)
    set_service(team, service(team) + cost)
  end
end
if FAIR then
  redis.call('PEXPIRE', SERVICE, 3600000)
end
-- Keys that are never touched again expire on their own (a route or team removed by a reload).
redis.call('PEXPIRE', SLOTS, 3600000)
if max_parallel > 0 then
  redis.call('ZADD', KEYS[7], now + TTL + WQ, member)
  redis.call('PEXPIRE', KEYS[7], 3600000)
end
if rpm > 0 then
  redis.call('HINCRBY', KEYS[8], second, 1)
  redis.call('PEXPIRE', KEYS[8], 120000)
  rpm_used = rpm_used + 1
end
if tpm > 0 then
  redis.call('HINCRBY', KEYS[9], second, tokens)
  redis.call('PEXPIRE', KEYS[9], 120000)
  tpm_used = tpm_used + tokens
end
return {outcome, ahead, rpm_used, tpm_used, rpm_reset, tpm_reset, second}
