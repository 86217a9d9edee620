"""Shaped network tiers for multi-process runs on one machine: Linux network namespaces joined by veth pairs.

A benchmark that must show what communication costs (GIFT and SCAPE against fp32 all-reduce, the
performance model's inter-node tier) cannot use loopback: on loopback a gloo all-reduce of a few MB is
nearly free. :class:`ShapedNetwork` builds ``n_hosts`` network namespaces ("hosts"), each with one veth
interface plugged into a bridge that lives in a hub namespace of its own, and rate-shapes every host's
egress with ``tc``'s ``htb`` qdisc (``netem`` is not in this kernel, so no delay is added: latency is
the link's own queueing). Ranks started in the same host talk over that host's loopback (the fast
tier, unshaped unless ``intra_rate_mbit`` is given); ranks in different hosts cross the shaped veth
(the slow tier, like an inter-node link)::

    host 0 netns            hub netns               host 1 netns
    lo (fast tier)                                  lo (fast tier)
    veth0 10.241.0.1 --htb-- [bridge br0] --htb-- veth0 10.241.0.2
                              (slow tier)

Only the addresses inside these namespaces are used (10.241.0.0/24, which no other namespace can see);
nothing in the root namespace is changed beyond transient veth names while the pairs are moved.
Everything is removed on :meth:`ShapedNetwork.close` (also on ``__exit__`` after an exception, and at
interpreter exit); namespaces left by a killed process are removed by the next :class:`ShapedNetwork`
(their names carry the owner's pid).

Needs root (``CAP_NET_ADMIN``), ``ip`` and ``tc`` from iproute2 and the ``sch_htb`` qdisc.
:func:`netns_unavailable` says why not, for a ``pytest.skip`` or a benchmark's message.

Usage::

    from lab.training.netns import ShapedNetwork, netns_unavailable
    with ShapedNetwork(n_hosts=2, rate_mbit=200.0) as net:
        env = {**os.environ, **net.host_env(i)}      # GLOO_SOCKET_IFNAME, MASTER_ADDR
        p = net.popen(i, [sys.executable, "-m", "my.rank"], env=env)
        net.measure_mbit(0, 1)                       # about 200 (TCP goodput over the shaped link)
"""

from __future__ import annotations

import atexit
import dataclasses
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
import weakref

from lab.training.errors import NetnsError

__all__ = ["ShapedNetwork", "NetHost", "netns_unavailable", "remove_stale_namespaces"]

_PREFIX = "rlnet"
_NAME_RE = re.compile(rf"^{_PREFIX}-(\d+)-([0-9a-f]+)-(hub|h\d+)$")
_SUBNET = "10.241.0"
_IFNAME = "veth0"
_live: "weakref.WeakSet[ShapedNetwork]" = weakref.WeakSet()
_probe_result: list[str | None] = []


def _run(argv: list[str], *, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess:
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise NetnsError(f"{argv[0]!r} not found: install iproute2") from exc
    except subprocess.TimeoutExpired as exc:
        raise NetnsError(f"`{' '.join(argv)}` did not finish in {timeout:g} s") from exc
    if check and cp.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed (exit {cp.returncode}): {cp.stderr.strip() or cp.stdout.strip()}")
    return cp


def _list_netns() -> list[str]:
    cp = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in cp.stdout.splitlines() if line.strip()]


def _kill_netns_pids(ns: str) -> None:
    cp = _run(["ip", "netns", "pids", ns], check=False)
    for tok in cp.stdout.split():
        try:
            os.kill(int(tok), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass


def _delete_netns(ns: str) -> None:
    _kill_netns_pids(ns)
    _run(["ip", "netns", "del", ns], check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_namespaces() -> list[str]:
    """Delete the namespaces of :class:`ShapedNetwork` s whose owning process has died.

    Returns
    -------
    list of str
        The names removed. Namespaces of live owners (another benchmark running now) are kept.
    """
    removed = []
    for ns in _list_netns():
        m = _NAME_RE.match(ns)
        if m and not _pid_alive(int(m.group(1))):
            _delete_netns(ns)
            removed.append(ns)
    return removed


def netns_unavailable() -> str | None:
    """Why :class:`ShapedNetwork` cannot be built here, or None when it can.

    The check (cached for the process) really creates a namespace with an ``htb`` qdisc on its
    loopback and removes it: root alone is not enough (a container may lack ``CAP_NET_ADMIN`` or the
    ``sch_htb`` module).

    Returns
    -------
    str or None
        A sentence naming what is missing (not root, no ``ip``/``tc``, namespace or qdisc refused).
    """
    if _probe_result:
        return _probe_result[0]
    reason: str | None = None
    if sys.platform != "linux":
        reason = f"network namespaces need Linux (this is {sys.platform})"
    elif os.geteuid() != 0:
        reason = "network namespaces need root (CAP_NET_ADMIN); run the benchmark as root"
    elif not (shutil.which("ip") and shutil.which("tc")):
        reason = "`ip` and `tc` (iproute2) are not on PATH"
    else:
        probe = f"{_PREFIX}-{os.getpid()}-{uuid.uuid4().hex[:6]}-hub"
        try:
            _run(["ip", "netns", "add", probe])
            _run(["ip", "-n", probe, "link", "set", "lo", "up"])
            _run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:",
                  "htb", "default", "10"])
        except NetnsError as exc:
            reason = f"cannot build a shaped namespace here: {exc}"
        finally:
            _run(["ip", "netns", "del", probe], check=False)
    _probe_result.append(reason)
    return reason


@dataclasses.dataclass(frozen=True)
class NetHost:
    """One host of a :class:`ShapedNetwork`.

    Attributes
    ----------
    index : int
        Position in :attr:`ShapedNetwork.hosts`.
    netns : str
        The namespace's name (``ip netns exec <netns> ...``).
    address : str
        Its IPv4 address on the shaped link (``10.241.0.<index + 1>``).
    ifname : str
        The interface that carries that address inside the namespace (for ``GLOO_SOCKET_IFNAME``).
    """

    index: int
    netns: str
    address: str
    ifname: str


def _htb(ns: str, dev: str, rate_mbit: float) -> None:
    # burst: at least one MTU-sized packet per timer tick at this rate (tc's own rule of thumb), >= 32 KiB
    rate_bps = rate_mbit * 1e6
    burst_bytes = max(32 * 1024, int(rate_bps / 8 / 250))
    tc = ["ip", "netns", "exec", ns, "tc"]
    _run(tc + ["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"])
    _run(tc + ["class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb",
               "rate", f"{rate_bps:.0f}bit", "ceil", f"{rate_bps:.0f}bit",
               "burst", str(burst_bytes), "cburst", str(burst_bytes)])


class ShapedNetwork:
    """``n_hosts`` network namespaces on one rate-shaped bridge (see the module docstring).

    Parameters
    ----------
    n_hosts : int
        Number of hosts (namespaces), 1 to 250.
    rate_mbit : float or None
        Egress rate of every host's veth in Mbit/s (each direction of every host pair is limited to it),
        or None for an unshaped link.
    intra_rate_mbit : float or None
        Rate of each host's loopback (the fast tier between ranks on one host) in Mbit/s, or None to
        leave loopback unshaped.

    Raises
    ------
    NetnsError
        A parameter is out of range (named), namespaces cannot be made here (the reason from
        :func:`netns_unavailable`), or an ``ip``/``tc`` step failed (the command and its message);
        whatever was built before the failure is removed.

    Notes
    -----
    ``htb`` shapes with a token bucket: a burst of up to ``max(32 KiB, rate/250 s)`` passes at line rate,
    then the rate holds. Measured TCP goodput is a little under the set rate (headers), see
    :meth:`measure_mbit`.
    """

    def __init__(self, n_hosts: int = 2, rate_mbit: float | None = None, intra_rate_mbit: float | None = None):
        if not isinstance(n_hosts, int) or isinstance(n_hosts, bool) or not 1 <= n_hosts <= 250:
            raise NetnsError(f"n_hosts must be an int from 1 to 250, got {n_hosts!r}")
        for field, v in (("rate_mbit", rate_mbit), ("intra_rate_mbit", intra_rate_mbit)):
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)
                                  or not math.isfinite(v) or v <= 0):
                raise NetnsError(f"{field} must be a positive number of Mbit/s or None, got {v!r}")
        reason = netns_unavailable()
        if reason is not None:
            raise NetnsError(reason)
        self.n_hosts, self.rate_mbit, self.intra_rate_mbit = n_hosts, rate_mbit, intra_rate_mbit
        self._tag = f"{_PREFIX}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.hub = f"{self._tag}-hub"
        self.hosts: list[NetHost] = []
        self._procs: list[subprocess.Popen] = []
        self._made: list[str] = []
        self._closed = False
        remove_stale_namespaces()
        _live.add(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # -- building ---------------------------------------------------------------------------------
    def _build(self) -> None:
        _run(["ip", "netns", "add", self.hub])
        self._made.append(self.hub)
        _run(["ip", "-n", self.hub, "link", "set", "lo", "up"])
        _run(["ip", "-n", self.hub, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.hub, "link", "set", "br0", "up"])
        short = self._tag.rsplit("-", 1)[1]
        for i in range(self.n_hosts):
            ns = f"{self._tag}-h{i}"
            _run(["ip", "netns", "add", ns])
            self._made.append(ns)
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            # created directly inside the namespaces: no name ever appears in the root namespace
            a, b = f"rv{short}{i}a", f"rv{short}{i}b"
            _run(["ip", "-n", ns, "link", "add", a, "type", "veth", "peer", "name", b, "netns", self.hub])
            _run(["ip", "-n", ns, "link", "set", a, "name", _IFNAME])
            addr = f"{_SUBNET}.{i + 1}"
            _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", _IFNAME])
            _run(["ip", "-n", ns, "link", "set", _IFNAME, "up"])
            _run(["ip", "-n", self.hub, "link", "set", b, "master", "br0"])
            _run(["ip", "-n", self.hub, "link", "set", b, "up"])
            if self.rate_mbit is not None:
                _htb(ns, _IFNAME, float(self.rate_mbit))
            if self.intra_rate_mbit is not None:
                _htb(ns, "lo", float(self.intra_rate_mbit))
            self.hosts.append(NetHost(index=i, netns=ns, address=addr, ifname=_IFNAME))

    # -- use --------------------------------------------------------------------------------------
    def _host(self, i: int) -> NetHost:
        if self._closed:
            raise NetnsError(f"ShapedNetwork {self._tag} is closed")
        if not isinstance(i, int) or not 0 <= i < len(self.hosts):
            raise NetnsError(f"host index {i!r} is not in 0..{len(self.hosts) - 1}")
        return self.hosts[i]

    def exec_prefix(self, i: int) -> list[str]:
        """The argv prefix that runs a command in host ``i`` (``["ip", "netns", "exec", <netns>]``)."""
        return ["ip", "netns", "exec", self._host(i).netns]

    def host_env(self, i: int, master: int = 0) -> dict[str, str]:
        """Environment for a torch.distributed rank on host ``i``: ``GLOO_SOCKET_IFNAME`` (the shaped
        interface, so gloo binds the address the other hosts reach) and ``MASTER_ADDR`` (host ``master``)."""
        return {"GLOO_SOCKET_IFNAME": self._host(i).ifname, "MASTER_ADDR": self._host(master).address}

    def popen(self, i: int, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside host ``i`` (keyword arguments go to :class:`subprocess.Popen`).

        The process is killed by :meth:`close` if it is still running then.
        """
        p = subprocess.Popen(self.exec_prefix(i) + list(argv), **kwargs)
        self._procs.append(p)
        return p

    def run(self, i: int, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` inside host ``i`` to completion (keyword arguments go to :func:`subprocess.run`)."""
        return subprocess.run(self.exec_prefix(i) + list(argv), **kwargs)

    def measure_mbit(self, src: int, dst: int, seconds: float = 1.0, port: int = 47613) -> float:
        """Measured TCP goodput from host ``src`` to host ``dst``, in Mbit/s.

        Sends for about ``seconds`` (at the set rate; at least 1 MiB) from a Python sender in ``src`` to a
        receiver in ``dst`` and times the transfer at the receiver, from the first byte to the last, so the
        bucket's initial burst counts only once.

        Raises
        ------
        NetnsError
            ``src == dst``, a bad index, or the transfer failed (its stderr).
        """
        if src == dst:
            raise NetnsError(f"measure_mbit needs two different hosts, got src = dst = {src}")
        rate = self.rate_mbit or 1000.0
        nbytes = max(1 << 20, int(rate * 1e6 / 8 * seconds))
        recv_code = (
            "import socket,time,sys\n"
            f"s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind(('{self._host(dst).address}',{port}))\n"
            "s.listen(1);print('ready',flush=True);c,_=s.accept();n=0;t0=None\n"
            f"while n<{nbytes}:\n"
            " b=c.recv(1<<20)\n"
            " if not b: break\n"
            " t0=t0 or time.perf_counter();n+=len(b)\n"
            "print(n, time.perf_counter()-t0, flush=True)\n")
        send_code = (
            "import socket\n"
            f"c=socket.create_connection(('{self._host(dst).address}',{port}));buf=bytes(1<<16);left={nbytes}\n"
            "while left>0:\n"
            " c.sendall(buf[:min(left,len(buf))]);left-=len(buf)\n"
            "c.close()\n")
        recv = self.popen(dst, [sys.executable, "-c", recv_code], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
        try:
            if recv.stdout.readline().strip() != "ready":
                raise NetnsError(f"bandwidth receiver on host {dst} did not start: {recv.stderr.read()}")
            send = self.run(src, [sys.executable, "-c", send_code], capture_output=True, text=True,
                            timeout=60 + 4 * seconds)
            if send.returncode != 0:
                raise NetnsError(f"bandwidth sender on host {src} failed: {send.stderr.strip()}")
            out, err = recv.communicate(timeout=30)
            if recv.returncode != 0:
                raise NetnsError(f"bandwidth receiver on host {dst} failed: {err.strip()}")
        finally:
            if recv.poll() is None:
                recv.kill()
                recv.wait()
        n, dt = out.split()
        return float(n) * 8 / max(float(dt), 1e-9) / 1e6

    # -- teardown ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill the processes started in the hosts and delete every namespace (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for p in self._procs:
            if p.poll() is None:
                p.kill()
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for ns in reversed(self._made):
            _delete_netns(ns)
        self._made.clear()
        _live.discard(self)

    def __enter__(self) -> "ShapedNetwork":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.hosts)} hosts"
        return f"ShapedNetwork({self._tag}, {state}, rate_mbit={self.rate_mbit}, intra_rate_mbit={self.intra_rate_mbit})"


@atexit.register
def _close_all() -> None:  # pragma: no cover - interpreter exit
    for net in list(_live):
        try:
            net.close()
        except Exception:
            pass
