# expect: the bubble is the other pp - 1 slots   (the check's message must say this: it recognised the mistake)
p = ex.learned.predict(cfg, method="closed_form")
answer = cfg.n_micro_batches * (p.max_fwd_s + p.max_bwd_s)
