-- Token bucket (distlimit_core::algorithm::TokenBucket). Parameters: burst, L' (units refilled
-- per µs), P' (units per token), from Quota::refill_units.
-- Reads `v`, the value at `key` (nil when there is none), as a token bucket state under burst,
-- L' = rate and P' = unit at `now`: its deficit and last update, carried over first when it was
-- written under other parameters (State::carried: the whole tokens spent then at `now`, refilled
-- at the old rate and rounded up, capped at the burst, are spent now), and whether it was; then
-- whether it read as fresh (no value, or a well-formed state of another algorithm). A value it
-- cannot read: nil, message.
local function read_token_bucket(v, key, burst, rate, unit, now)
  local deficit, last, wb, wr, wu = 0, 0, burst, rate, unit
  if not v then
    return 0, 0, false, true
  end
  local len = #v
  local ok = string.byte(v) == 1 and (len == 41 or len == 17)
  if ok then
    if len == 41 then
      deficit, last, wb, wr, wu = struct.unpack('>ddddd', v, 2)
    else
      deficit, last = struct.unpack('>dd', v, 2)
    end
    ok = deficit >= 0 and deficit < 9007199254740992 and deficit % 1 == 0
      and last >= 0 and last < 9007199254740992 and last % 1 == 0
      and wb >= 1 and wb < 9007199254740992 and wb % 1 == 0
      and wr >= 1 and wr < 9007199254740992 and wr % 1 == 0
      and wu >= 1 and wu < 9007199254740992 and wu % 1 == 0
  end
  if not ok then
    local fresh, err = other(v, 1, 'token_bucket', key)
    if not fresh then
      return nil, err
    end
    return 0, 0, false, true
  end
  local carried = wb ~= burst or wr ~= rate or wu ~= unit
  if carried then
    local d = deficit
    if last < now and deficit > 0 then
      if now - last < math.ceil(deficit / wr) then
        d = deficit - (now - last) * wr
      else
        d = 0
      end
    end
    d = math.ceil(d / wu)
    if d > burst then
      d = burst
    end
    deficit = d * unit
    if now > last then
      last = now
    end
  end
  return deficit, last, carried, false
end

local function decide_token_bucket(key, now, cost, burst, rate, unit)
  -- A carried-over state is kept even when denied.
  local deficit, last, carried = read_token_bucket(redis.call('GET', key), key, burst, rate, unit, now)
  if not deficit then
    return nil, last
  end
  -- The deficit d at now, and the wait before anything refills. Nothing refills before `last`
  -- (the clock went back): there elapsed = 0, so d = deficit. Otherwise the comparison keeps
  -- elapsed * rate below deficit + rate. A full bucket (deficit 0) skips the arithmetic.
  local d, wait, avail = deficit, 0, burst
  if last > now then
    wait = last - now
  elseif deficit > 0 then
    local elapsed = now - last
    if elapsed < math.ceil(deficit / rate) then
      d = deficit - elapsed * rate
    else
      d = 0
    end
  end
  if d > 0 then
    avail = burst * unit - d
    if avail < 0 then
      avail = 0
    else
      avail = math.floor(avail / unit)
    end
  end
  local want = cost >= 1 and cost or 1
  if want <= avail then
    local need = d + cost * unit
    local reset = 0
    if need > 0 then
      reset = wait + math.ceil(need / rate)
    end
    if cost > 0 then
      -- wait > 0 exactly when last > now: the update time stays max(last, now).
      return 1, burst, avail - cost, reset, 0,
        struct.pack('>Bddddd', 1, need, now + wait, burst, rate, unit)
    end
    return 1, burst, avail, reset, 0
  end
  local reset = 0
  if d > 0 then
    reset = wait + math.ceil(d / rate)
  end
  local retry = wait
  local over = d - (burst - want) * unit
  if over > 0 then
    retry = wait + math.ceil(over / rate)
  end
  if retry < 1 then
    retry = 1
  end
  if carried and cost > 0 then
    return 0, burst, avail, reset, retry,
      struct.pack('>Bddddd', 1, deficit, last, burst, rate, unit)
  end
  return 0, burst, avail, reset, retry
end
