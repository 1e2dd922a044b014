-- Every algorithm's decision by its number (1 token bucket, 2 gcra, 3 fixed window, 4 sliding
-- log, 5 sliding window), for the general path; the functions defined just above, at the top
-- level, where refund.lua, lease.lua and settle.lua find them too.
local algorithms = {decide_token_bucket, decide_gcra, decide_fixed_window, decide_sliding_log,
  decide_sliding_window}

-- A token bucket's deficit refilled at `rate` from `last` to `now` (nothing refills before
-- `last`: the clock went back), and its update time, max(last, now). For refund.lua, lease.lua
-- and settle.lua.
local function refilled(deficit, last, now, rate)
  if last < now then
    if now - last < math.ceil(deficit / rate) then
      deficit = deficit - (now - last) * rate
    else
      deficit = 0
    end
    last = now
  end
  return deficit, last
end

-- Writes `state` at `key` with the TTL of a state that may be forgotten `ttl` µs from now, or
-- deletes the key when that is not in the future (the state then decides like a fresh one).
local function store(key, state, ttl, slack)
  if ttl > 0 then
    write(key, state, ttl, slack)
  else
    redis.call('DEL', key)
  end
end
