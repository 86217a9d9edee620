# expect: generation 12 was torn   (the check's message must say this: it recognised the mistake)
# A plausible wrong attempt at notebook 06's exercise: the newest generation *written* is taken, not the newest committed.
pp = PingPong({"w": torch.zeros(3)})
for g in range(12):
    pp.write(g, {"w": torch.full((3,), float(g))})
try:
    pp.write(12, {"w": torch.full((3,), 12.0)}, between=lambda name: (_ for _ in ()).throw(RuntimeError("killed")))
except RuntimeError:
    pass
answer = 12
