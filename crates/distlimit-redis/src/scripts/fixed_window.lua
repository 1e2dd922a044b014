-- Fixed window (distlimit_core::algorithm::FixedWindow). Parameters: limit, period (µs).
-- State: tag 3, then the window start (µs) and its count.
local function decide_fixed_window(key, A, i, now, cost)
  local limit, period = tonumber(A[i]), tonumber(A[i + 1])
  local start, count = 0, 0
  local v = redis.call('GET', key)
  if v then
    local ok = string.byte(v) == 3 and #v == 17
    if ok then
      start, count = struct.unpack('>dd', v, 2)
      ok = start >= 0 and start < 9007199254740992 and start % 1 == 0
        and count >= 0 and count < 9007199254740992 and count % 1 == 0
    end
    if not ok then
      local fresh, err = other(v, 3, 'fixed_window', key)
      if not fresh then
        return nil, err
      end
      start, count = 0, 0
    end
  end
  -- Windows are aligned to multiples of the period; before the stored start (the clock went
  -- back) the stored window stays current.
  local s = now - now % period
  if s > start then
    start, count = s, 0
  end
  local avail = limit - count
  if avail < 0 then
    avail = 0
  end
  -- Until the end of the window: at least 1 µs, as start >= now - now % period.
  local left = start + period - now
  local want = cost
  if want < 1 then
    want = 1
  end
  if want <= avail then
    local reset = 0
    if count + cost > 0 then
      reset = left
    end
    if cost > 0 then
      return 1, limit, avail - cost, reset, 0, struct.pack('>Bdd', 3, start, count + cost)
    end
    return 1, limit, avail, reset, 0
  end
  local reset = 0
  if count > 0 then
    reset = left
  end
  return 0, limit, avail, reset, left
end
