-- Leases on KEYS[1] (distlimit_core::Limit::give_back then Limit::take, at one instant): give back
-- ARGV[3] unspent units, then withdraw up to ARGV[4] of the units available.
-- ARGV: time ('' = the server's TIME), algorithm (1 token bucket, 2 gcra), give back (at most
-- 2^52, capped here at the burst of the key's state), want (at most the capacity), then the
-- algorithm's parameters (as for its single-key script).
-- Reply: granted, then the five decision fields (what decide_<algorithm> answers for a request of
-- the units granted, or its peek when nothing was granted), as six big-endian doubles.

-- Writes `state` with the TTL of a state that may be forgotten `ttl` µs from now, or deletes the
-- key when that is not in the future (the state then decides like a fresh one).
local function store(key, state, ttl, slack)
  if ttl > 0 then
    redis.call('SET', key, state, 'PX', string.format('%d', math.ceil(ttl / 1000) + slack))
  else
    redis.call('DEL', key)
  end
end

-- Units go back under the quota the state was written under (the one they were taken under),
-- which stays its quota: the next decision carries it over (Limit::give_back_from).

-- Token bucket (TokenBucket::give_back): the deficit at `now` less `units` tokens, at least 0.
-- A key without a state, or with another algorithm's, is full already: nothing changes.
local function give_back_token_bucket(key, A, i, now, units, slack)
  local burst, rate, unit = tonumber(A[i]), tonumber(A[i + 1]), tonumber(A[i + 2])
  local v = redis.call('GET', key)
  if v and #v == 41 and string.byte(v) == 1 then
    local _, _, wb, wr, wu = struct.unpack('>ddddd', v, 2)
    burst, rate, unit = wb, wr, wu
  end
  if units > burst then
    units = burst
  end
  local deficit, last, _, fresh = read_token_bucket(v, key, burst, rate, unit, now)
  if not deficit then
    return last
  end
  if fresh then
    return
  end
  local d = deficit
  if last < now and deficit > 0 then
    if now - last < math.ceil(deficit / rate) then
      d = deficit - (now - last) * rate
    else
      d = 0
    end
  end
  d = d - units * unit
  if d < 0 then
    d = 0
  end
  if now > last then
    last = now
  end
  store(key, struct.pack('>Bddddd', 1, d, last, burst, rate, unit),
    last + math.ceil(d / rate) - now, slack)
end

-- GCRA (Gcra::give_back): the arrival time moves back by units * T, never before now. A key
-- without a state, or with another algorithm's, is full already: nothing changes.
local function give_back_gcra(key, A, i, now, units, slack)
  local burst, t = tonumber(A[i]), tonumber(A[i + 1])
  local v = redis.call('GET', key)
  if v and #v == 25 and string.byte(v) == 2 then
    local _, wb, wt = struct.unpack('>ddd', v, 2)
    burst, t = wb, wt
  end
  if units > burst then
    units = burst
  end
  local tat, carried, fresh = read_gcra(v, key, burst, t, now)
  if not tat then
    return carried
  end
  if fresh then
    return
  end
  if tat > now then
    tat = tat - units * t
    if tat < now then
      tat = now
    end
  end
  store(key, struct.pack('>Bddd', 2, tat, burst, t), tat - now, slack)
end

local key, now, slack = KEYS[1], ARGV[1], 0
if now == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now, slack = tonumber(now), CLIENT_SLACK_MS
end
local decide, give_back
if ARGV[2] == '1' then
  decide, give_back = decide_token_bucket, give_back_token_bucket
elseif ARGV[2] == '2' then
  decide, give_back = decide_gcra, give_back_gcra
else
  return redis.error_reply('DISTLIMIT_ARGS leases need the token bucket or GCRA, not ' .. tostring(ARGV[2]))
end
local back, want = tonumber(ARGV[3]), tonumber(ARGV[4])
if back > 0 then
  local err = give_back(key, ARGV, 5, now, back, slack)
  if err then
    return redis.error_reply(err)
  end
end
-- A peek: `remaining` is what is available now.
local a, l, r, rs, rt = decide(key, ARGV, 5, now, 0)
if not a then
  return redis.error_reply(l)
end
local granted = want
if granted > r then
  granted = r
end
if granted > 0 then
  local state
  a, l, r, rs, rt, state = decide(key, ARGV, 5, now, granted)
  if not a then
    return redis.error_reply(l)
  end
  if state then
    redis.call('SET', key, state, 'PX', string.format('%d', math.ceil(rs / 1000) + slack))
  end
end
return struct.pack('>dddddd', granted, a, l, r, rs, rt)
