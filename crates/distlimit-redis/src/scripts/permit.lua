-- Permits (op 7 of entry.lua): distlimit_core::Permits on the sorted set at `key`, one member per
-- permit (its id in decimal), scored by the instant it expires (µs; live while now < score).
-- `action` 0 acquires permit `id` (at most `max` live), 1 releases it, 2 renews it; `lease` is
-- the lease in µs. Every call first drops the permits expired at `now`. The key expires (PXAT,
-- ms, rounded up) when its last permit does, plus the client-time slack; Redis deletes it by
-- itself when its last permit is released.
-- Returns five big-endian doubles: ok (1 admitted / was live, 0 not), the id, the live permits
-- after the call, retry_after µs (a denied acquire: until the earliest permit expires; else 0)
-- and the permits found expired.
local function permit(key, max, lease, now, id, action, slack)
  local expired = redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
  local n = redis.call('ZCARD', key)
  local member = string.format('%d', id)
  local at = string.format('%d', now + lease)
  local ok, retry = 0, 0
  local live = redis.call('ZSCORE', key, member)
  if action == 0 then
    if live or n < max then
      redis.call('ZADD', key, at, member)
      if not live then
        n = n + 1
      end
      ok = 1
    else
      local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      retry = tonumber(first[2]) - now
    end
  elseif action == 1 then
    if live then
      redis.call('ZREM', key, member)
      n, ok = n - 1, 1
    end
  elseif live then
    redis.call('ZADD', key, 'XX', at, member)
    ok = 1
  end
  if ok == 1 and action ~= 1 then
    -- The key lives until its last permit expires (counted from the server's clock).
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    local ttl = tonumber(last[2]) - now
    redis.call('PEXPIREAT', key, string.format('%d', expiry + math.ceil(ttl / 1000) + slack))
  end
  return struct.pack('>ddddd', ok, id, n, retry, expired)
end
