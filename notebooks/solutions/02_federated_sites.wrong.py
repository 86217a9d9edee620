# expect: you added the transfer to the estimated start   (the check's message must say this: it recognised the mistake)
# A plausible wrong attempt (the check must reject it): the transfer is added to the estimated start,
# as if the data could only start moving once the job had left the queue.
t0 = decision.time
tau = {c.site: 0.0 if c.site == "theta" else 20e9 / 10e6 for c in decision.candidates}

completion_s = {c.site: c.estimated_start + tau[c.site] + c.walltime_s - t0 for c in decision.candidates if c.eligible}
answer = {"completion_s": completion_s, "chosen": min(completion_s, key=completion_s.get)}
answer
