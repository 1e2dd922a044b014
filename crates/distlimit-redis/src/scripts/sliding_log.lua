-- Sliding log (distlimit_core::algorithm::SlidingLog). Parameters: limit, period (µs). An
-- entry counts while instant + period > now.
local function decide_sliding_log(key, now, cost, limit, period)
  -- used: the live entries' cost; live: byte offset of the first live entry (0: none); len: the
  -- value's length; last_t, last_c: the newest entry.
  local used, live, len, last_t, last_c = 0, 0, 0, -1, 0
  local v = redis.call('GET', key)
  if v then
    len = #v
    if string.byte(v) == 4 and len % 16 == 1 then
      local pos = 2
      while pos < len do
        local t, c = struct.unpack('>dd', v, pos)
        if not (t > last_t and t < 9007199254740992 and t % 1 == 0
            and c >= 1 and c < 9007199254740992 and c % 1 == 0) then
          return other(v, 4, 'sliding_log', key)
        end
        if live == 0 and t + period > now then
          live = pos
        end
        if live > 0 then
          used = used + c
        end
        last_t, last_c = t, c
        pos = pos + 16
      end
    else
      local fresh, err = other(v, 4, 'sliding_log', key)
      if not fresh then
        return nil, err
      end
    end
  end
  local avail = limit - used
  if avail < 0 then
    avail = 0
  end
  local want = cost >= 1 and cost or 1
  -- Until the newest live entry leaves the window (the newest entry is live when any is).
  local reset = 0
  if live > 0 then
    reset = last_t + period - now
  end
  if want <= avail then
    if cost > 0 then
      local state
      if live == 0 then
        reset = period
        state = struct.pack('>Bdd', 4, now, cost)
      elseif last_t >= now then
        state = '\4' .. string.sub(v, live, len - 16) .. struct.pack('>dd', last_t, last_c + cost)
      else
        reset = period
        state = '\4' .. string.sub(v, live) .. struct.pack('>dd', now, cost)
      end
      return 1, limit, avail - cost, reset, 0, state
    end
    return 1, limit, avail, reset, 0
  end
  -- Wait until enough of the oldest live entries have left the window.
  local target, retry, pos = limit - want, period, live
  while pos > 0 and pos < len do
    local t, c = struct.unpack('>dd', v, pos)
    used = used - c
    if used <= target then
      retry = t + period - now
      break
    end
    pos = pos + 16
  end
  if retry < 1 then
    retry = 1
  end
  return 0, limit, avail, reset, retry
end
