-- GCRA (distlimit_core::algorithm::Gcra). Parameters: burst, T = ceil(period / limit) (µs per
-- unit). State: tag 2, then the theoretical arrival time (µs).
local function decide_gcra(key, A, i, now, cost)
  local burst, t = tonumber(A[i]), tonumber(A[i + 1])
  local tat = 0
  local v = redis.call('GET', key)
  if v then
    local ok = string.byte(v) == 2 and #v == 9
    if ok then
      tat = struct.unpack('>d', v, 2)
      ok = tat >= 0 and tat < 9007199254740992 and tat % 1 == 0
    end
    if not ok then
      local fresh, err = other(v, 2, 'gcra', key)
      if not fresh then
        return nil, err
      end
      tat = 0
    end
  end
  -- The debt: µs of emission the key is ahead of now (an idle key skips the division).
  local debt, avail = tat - now, burst
  if debt > 0 then
    avail = burst - math.ceil(debt / t)
    if avail < 0 then
      avail = 0
    end
  else
    debt = 0
  end
  local want = cost
  if want < 1 then
    want = 1
  end
  if want <= avail then
    local reset = debt + cost * t
    if cost > 0 then
      -- The new tat, max(tat, now) + cost * T, is now + reset.
      return 1, burst, avail - cost, reset, 0, struct.pack('>Bd', 2, now + reset)
    end
    return 1, burst, avail, reset, 0
  end
  local retry = debt - (burst - want) * t
  if retry < 1 then
    retry = 1
  end
  return 0, burst, avail, debt, retry
end
