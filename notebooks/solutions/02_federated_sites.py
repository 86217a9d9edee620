# Reference solution: replaces the cell tagged "exercise" in notebooks/02_federated_sites.ipynb.
t0 = decision.time
tau = {c.site: 0.0 if c.site == "theta" else 20e9 / 10e6 for c in decision.candidates}   # seconds to get the input there

completion_s = {}
for c in decision.candidates:
    if not c.eligible:
        continue
    start = t0 if c.estimated_start is None else c.estimated_start
    ready = max(t0, start, t0 + tau[c.site])        # the job needs both a slot and its input
    completion_s[c.site] = ready + c.walltime_s - t0

chosen = min(completion_s, key=lambda site: (completion_s[site], site))
answer = {"completion_s": completion_s, "chosen": chosen}
answer
