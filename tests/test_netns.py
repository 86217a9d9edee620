"""lab.training.netns: shaped namespaces are built, hold their rate, carry gloo, and are always removed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lab.training.errors import NetnsError
from lab.training.netns import ShapedNetwork, netns_unavailable, remove_stale_namespaces

_why = netns_unavailable()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _ours() -> set[str]:
    """This process's namespaces (other processes may build their own at the same time)."""
    return {ns for ns in _namespaces() if ns.startswith(f"rlnet-{os.getpid()}-")}


def test_shaped_link_holds_its_rate_within_15_percent_both_ways():
    with ShapedNetwork(n_hosts=2, rate_mbit=80.0) as net:
        for src, dst in ((0, 1), (1, 0)):
            mbit = net.measure_mbit(src, dst, seconds=0.6)
            assert 0.85 * 80.0 <= mbit <= 1.15 * 80.0, (src, dst, mbit)


def test_unshaped_link_is_much_faster_than_a_shaped_one():
    with ShapedNetwork(n_hosts=2, rate_mbit=None) as net:
        fast = net.measure_mbit(0, 1, seconds=0.3)
    assert fast > 5 * 80.0, fast


def test_namespaces_and_links_are_removed_even_when_the_body_fails():
    with pytest.raises(RuntimeError, match="body failed"):
        with ShapedNetwork(n_hosts=3, rate_mbit=50.0) as net:
            made = {h.netns for h in net.hosts} | {net.hub}
            assert made <= _namespaces()
            sleeper = net.popen(1, ["sleep", "60"])
            raise RuntimeError("body failed")
    assert sleeper.poll() is not None, "a process started in a host survived close()"
    assert not made & _namespaces()
    assert not _ours(), "a namespace of this process was left behind"
    with pytest.raises(NetnsError, match="closed"):
        net.exec_prefix(0)


def test_stale_namespaces_of_a_dead_owner_are_removed_and_a_live_owners_kept():
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"rlnet-{dead.pid}-abcdef-h0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        with ShapedNetwork(n_hosts=1) as net:
            assert stale not in _namespaces()
            assert net.hosts[0].netns in _namespaces()
            assert net.hosts[0].netns not in remove_stale_namespaces()  # its owner (this process) is alive
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)


def test_gloo_all_reduce_crosses_the_shaped_link():
    code = (
        "import os, torch, torch.distributed as dist\n"
        "rank = int(os.environ['RANK'])\n"
        "dist.init_process_group('gloo', rank=rank, world_size=2,\n"
        "                        init_method=f\"tcp://{os.environ['MASTER_ADDR']}:29561\")\n"
        "x = torch.full((1000,), float(rank + 1))\n"
        "dist.all_reduce(x)\n"
        "print(float(x[0]))\n"
        "dist.destroy_process_group()\n")
    with ShapedNetwork(n_hosts=2, rate_mbit=100.0) as net:
        procs = [net.popen(i, [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env={**os.environ, **net.host_env(i), "RANK": str(i), "OMP_NUM_THREADS": "1"})
                 for i in range(2)]
        outs = [p.communicate(timeout=90) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.strip() == "3.0"


@pytest.mark.parametrize("kwargs, field", [
    ({"n_hosts": 0}, "n_hosts"), ({"n_hosts": 2.5}, "n_hosts"),
    ({"rate_mbit": -1.0}, "rate_mbit"), ({"rate_mbit": float("nan")}, "rate_mbit"),
    ({"intra_rate_mbit": 0}, "intra_rate_mbit"),
])
def test_bad_parameters_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(NetnsError, match=field):
        ShapedNetwork(**kwargs)
    assert not _ours()


def test_bad_host_index_is_named():
    with ShapedNetwork(n_hosts=2) as net:
        with pytest.raises(NetnsError, match="host index 5"):
            net.popen(5, ["true"])
        with pytest.raises(NetnsError, match="two different hosts"):
            net.measure_mbit(1, 1)
