# Reference solution of notebook 06b's exercise: the closed form's bubble is pp - 1 of its m - 1 + pp slots.
p = ex.learned.predict(cfg, method="closed_form")
answer = (cfg.pp - 1) * (p.max_fwd_s + p.max_bwd_s)
print(f"bubble {answer * 1e3:.2f} ms of the pipeline's {p.pipeline_s * 1e3:.2f} ms")
