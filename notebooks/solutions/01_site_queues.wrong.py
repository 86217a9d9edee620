# expect: every count is 0   (the check's message must say this: it recognised the mistake)
# A plausible wrong attempt (the check must reject it): submit_time is used as if it were an epoch time,
# but it counts seconds from the header's unix_start_time, so every job seems to have ended decades ago.
t = sites["HPC2N"].first_submit + 45 * 86400
jobs = traces["HPC2N"].jobs

submit = jobs["submit_time"].to_numpy("float64", na_value=np.nan)
start = submit + jobs["wait_time"].to_numpy("float64", na_value=np.nan)
end = start + jobs["run_time"].to_numpy("float64", na_value=np.nan)
processors = jobs["allocated_processors"].to_numpy("float64", na_value=np.nan)

pending = (submit <= t) & (t < start)
running = (start <= t) & (t < end)
answer = {"pending": int(pending.sum()), "running": int(running.sum()), "busy_processors": int(processors[running].sum())}
answer
