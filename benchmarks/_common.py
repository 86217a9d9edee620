"""What every benchmark's JSON carries: the machine it ran on, and a writer."""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path


def machine() -> dict:
    """Cores, Python, torch version and device (CUDA when present), platform."""
    info = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:  # torch is a dependency, but the HPC benchmarks do not need it
        info["torch"] = None
        info["device"] = "cpu"
    return info


def write(out: str | Path, result: dict) -> Path:
    """Write ``result`` plus ``machine`` and a UTC timestamp as indented JSON; echo it to stdout."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": result.pop("benchmark"), "when": datetime.now(timezone.utc).isoformat(), "machine": machine(), **result}
    out.write_text(json.dumps(payload, indent=2) + "\n")
    json.dump(payload, sys.stdout, indent=2)
    print()
    return out
