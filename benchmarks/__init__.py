"""Side-by-side benchmarks: ``python -m benchmarks.<name> --out FILE.json`` (method and baseline in one process)."""
