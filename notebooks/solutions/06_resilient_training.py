# Reference solution of notebook 06's exercise: a torn write leaves the previous generation committed.
pp = PingPong({"w": torch.zeros(3)})
for g in range(12):
    pp.write(g, {"w": torch.full((3,), float(g))})


def dies(name):
    raise RuntimeError("writer killed mid-copy")


try:
    pp.write(12, {"w": torch.full((3,), 12.0)}, between=dies)
except RuntimeError:
    pass
answer = max(pp.committed())
print("committed:", pp.committed(), "-> restore generation", answer)
