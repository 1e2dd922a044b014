-- Leases (op 5 of entry.lua): distlimit_core::Limit::give_back then Limit::take on `key`, at one
-- instant: give back `back` unspent units (at most 2^52, capped here at the burst of the key's
-- state), then withdraw up to `want` (at most the capacity) of the units available. `algorithm`
-- is 1 (token bucket) or 2 (GCRA), p1, p2, p3 its parameters (as for decide_<algorithm>) and
-- `slack` the client-time slack; writes go through algorithms.lua's `store` and entry.lua's
-- `settle`.
-- Returns granted, then the five decision fields (what decide_<algorithm> answers for a request
-- of the units granted, or its peek when nothing was granted), as six big-endian doubles; or
-- nil, message. The give-back helpers are local to it, so calls without a lease never build them.
local function lease(key, algorithm, p1, p2, p3, now, back, want, slack)
  -- Units go back under the quota the state was written under (the one they were taken under),
  -- which stays its quota: the next decision carries it over (Limit::give_back_from).

  -- Token bucket (TokenBucket::give_back): the deficit at `now` less `units` tokens, at least 0.
  -- A key without a state, or with another algorithm's, is full already: nothing changes.
  local function give_back_token_bucket(units)
    local burst, rate, unit = p1, p2, p3
    local v = redis.call('GET', key)
    if v and #v == 41 and string.byte(v) == 1 then
      local _, _, wb, wr, wu = struct.unpack('>ddddd', v, 2)
      burst, rate, unit = wb, wr, wu
    end
    units = math.min(units, burst)
    local deficit, last, _, fresh = read_token_bucket(v, key, burst, rate, unit, now)
    if not deficit then
      return last
    end
    if fresh then
      return
    end
    deficit, last = refilled(deficit, last, now, rate)
    local d = math.max(deficit - units * unit, 0)
    local state = struct.pack('>Bddddd', 1, d, last, burst, rate, unit)
    store(key, state, last + math.ceil(d / rate) - now, slack)
  end

  -- GCRA (Gcra::give_back): the arrival time moves back by units * T, never before now. A key
  -- without a state, or with another algorithm's, is full already: nothing changes.
  local function give_back_gcra(units)
    local burst, t = p1, p2
    local v = redis.call('GET', key)
    if v and #v == 25 and string.byte(v) == 2 then
      local _, wb, wt = struct.unpack('>ddd', v, 2)
      burst, t = wb, wt
    end
    units = math.min(units, burst)
    local tat, carried, fresh = read_gcra(v, key, burst, t, now)
    if not tat then
      return carried
    end
    if fresh then
      return
    end
    if tat > now then
      tat = math.max(tat - units * t, now)
    end
    store(key, struct.pack('>Bddd', 2, tat, burst, t), tat - now, slack)
  end

  local decide, give_back
  if algorithm == 1 then
    decide, give_back = decide_token_bucket, give_back_token_bucket
  elseif algorithm == 2 then
    decide, give_back = decide_gcra, give_back_gcra
  else
    return nil, 'DISTLIMIT_ARGS leases need the token bucket or GCRA, not ' .. tostring(algorithm)
  end
  if back > 0 then
    local err = give_back(back)
    if err then
      return nil, err
    end
  end
  -- A peek: `remaining` is what is available now.
  local a, l, r, rs, rt = decide(key, now, 0, p1, p2, p3)
  if not a then
    return nil, l
  end
  local granted = math.min(want, r)
  if granted > 0 then
    local reply, err = settle(key, decide, now, granted, slack, p1, p2, p3)
    if not reply then
      return nil, err
    end
    return struct.pack('>d', granted) .. reply
  end
  return struct.pack('>dddddd', 0, a, l, r, rs, rt)
end
