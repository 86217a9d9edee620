# expect: misses   (the check's message must say this: it recognised the mistake)
# A plausible wrong attempt: take the claims the paper-faithful plan invalidates; it keeps both changed claims
# through coincidental support paths, so the set it gives is too small.
paper_res, *_ = do(PAPER)
answer = {paper_res.trace.records[e.node].step for e in paper_res.plan.entries.values() if e.type == "claim" and e.op == "invalidate"}
