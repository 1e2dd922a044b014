-- Token bucket (distlimit_core::algorithm::TokenBucket). Parameters: burst, L' (units refilled
-- per µs), P' (units per token), from Quota::refill_units. State: tag 1, then the deficit
-- (units below full) and the last update (µs).
local function decide_token_bucket(key, A, i, now, cost)
  local burst, rate, unit = tonumber(A[i]), tonumber(A[i + 1]), tonumber(A[i + 2])
  local deficit, last = 0, 0
  local v = redis.call('GET', key)
  if v then
    local ok = string.byte(v) == 1 and #v == 17
    if ok then
      deficit, last = struct.unpack('>dd', v, 2)
      ok = deficit >= 0 and deficit < 9007199254740992 and deficit % 1 == 0
        and last >= 0 and last < 9007199254740992 and last % 1 == 0
    end
    if not ok then
      local fresh, err = other(v, 1, 'token_bucket', key)
      if not fresh then
        return nil, err
      end
      deficit, last = 0, 0
    end
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
  local want = cost
  if want < 1 then
    want = 1
  end
  if want <= avail then
    local need = d + cost * unit
    local reset = 0
    if need > 0 then
      reset = wait + math.ceil(need / rate)
    end
    if cost > 0 then
      -- wait > 0 exactly when last > now: the update time stays max(last, now).
      return 1, burst, avail - cost, reset, 0, struct.pack('>Bdd', 1, need, now + wait)
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
  return 0, burst, avail, reset, retry
end
