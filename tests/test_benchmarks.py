"""The benchmarks run and write the JSON their docs promise (no timing is asserted here)."""

from __future__ import annotations

import json

from benchmarks import queue_replay


def test_queue_replay_benchmark_writes_its_keys(tmp_path):
    out = tmp_path / "qr.json"
    queue_replay.main(["--out", str(out), "--trace", "hpc2n", "--snapshots", "200", "--baseline-snapshots", "10", "--repeat", "1"])
    result = json.loads(out.read_text())
    for key in ("jobs", "load_s", "snapshots_per_s", "baseline_snapshots_per_s", "speedup", "machine", "inputs"):
        assert key in result, key
    assert result["jobs"] == 3170
    assert result["results_agree"] is True
    assert result["speedup"] == result["snapshots_per_s"] / result["baseline_snapshots_per_s"]
    assert result["machine"]["cores"] >= 1 and result["machine"]["torch"].startswith("2.13.0")
    assert result["inputs"] == {"trace": "hpc2n", "snapshots": 200, "baseline_snapshots": 10, "repeat": 1}
