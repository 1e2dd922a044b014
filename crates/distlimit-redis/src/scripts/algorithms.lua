-- Every algorithm's decision by its number (1 token bucket, 2 gcra, 3 fixed window, 4 sliding
-- log, 5 sliding window), for the general path; the functions defined just above, at the top
-- level, where refund.lua, lease.lua and settle.lua find them too.
local algorithms = {decide_token_bucket, decide_gcra, decide_fixed_window, decide_sliding_log,
  decide_sliding_window}
