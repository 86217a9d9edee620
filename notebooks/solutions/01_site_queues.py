# Reference solution: replaces the cell tagged "exercise" in notebooks/01_site_queues.ipynb.
t = sites["HPC2N"].first_submit + 45 * 86400   # day 45 of the HPC2N trace, epoch seconds
jobs = traces["HPC2N"].jobs                     # the raw SWF columns (<NA> = unknown)
header = traces["HPC2N"].header                 # header.unix_start_time: what submit_time counts from


def column(name):
    return jobs[name].to_numpy("float64", na_value=np.nan)   # <NA> -> NaN, which fails every comparison


submit = header.unix_start_time + column("submit_time")       # s_j, epoch seconds
start = submit + column("wait_time")                           # b_j = s_j + w_j
end = start + column("run_time")                               # e_j = b_j + r_j
allocated = column("allocated_processors")
processors = np.where(np.isnan(allocated), column("requested_processors"), allocated)   # p_j
replayed = ~np.isnan(submit + start + end + processors)       # jobs with any unknown are not replayed

pending = replayed & (submit <= t) & (t < start)
running = replayed & (start <= t) & (t < end)
answer = {"pending": int(pending.sum()), "running": int(running.sum()), "busy_processors": int(processors[running].sum())}
answer
