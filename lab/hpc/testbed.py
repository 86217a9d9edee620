"""A real multi-site Slurm testbed on loopback: N independent Slurm clusters on this machine.

Each *site* is a complete Slurm 22.05 cluster (Debian's ``slurm-wlm``) with its
own ``slurm.conf``, ``ClusterName``, ports, state, spool, log, pid and
job-completion files, all inside its own directory. The sites run side by side
and know nothing of each other: job ids start at 1 on each, and a client picks
a site by the ``SLURM_CONF`` variable it is given per command (the testbed
never changes ``os.environ``).

Layout of ``DIR`` (default ``$LAB_TESTBED_DIR``, else
``~/.cache/research-lab/testbed``)::

    DIR/testbed.json            the state file: sites, ports, daemon PIDs
    DIR/<site>/slurm.conf       the site's configuration (SLURM_CONF=... selects the site)
    DIR/<site>/state/           StateSaveLocation
    DIR/<site>/spool/           SlurmdSpoolDir
    DIR/<site>/log/             slurmctld.log, slurmd.log (+ .out: the daemons' own stdout/stderr)
    DIR/<site>/run/             pid files
    DIR/<site>/jobcomp.log      jobcomp/filetxt: one ``key=value`` line per finished job

Per site the testbed starts ``slurmctld -D -i -f CONF`` and then
``slurmd -D -N NODE -f CONF`` as background processes, each in its own session
(process group), waits until ``scontrol ping`` answers and ``sinfo`` shows the
node ``idle`` (about a second), and records the PIDs in ``testbed.json``.
Settings (see ``notes/hpc.md``): ``auth/none`` + ``cred/none`` (no munge),
``proctrack/linuxproc``, ``task/none``, controller and node daemon bound to
127.0.0.1 only, ``select/cons_tres`` with ``CR_Core_Memory`` and
``DefMemPerCPU=500`` (else one job takes the whole node), backfill every second
(``bf_interval=1``), ``jobcomp/filetxt``, no accounting database, and
``SlurmdParameters=config_overrides`` so a site may declare more or fewer CPUs
and memory than the machine has. One node per site (``<site>n0``, its
``NodeHostname`` the real host name, ``NodeAddr=127.0.0.1``) in two partitions:
``debug`` (default, ``MaxTime`` 1 hour) and ``long`` (``MaxTime`` 1 day).

Units: CPUs as integers, memory in megabytes (Slurm's ``RealMemory``; the only
place ``lab`` counts memory in MB, because that is what slurm.conf takes),
times in seconds.

Command line::

    python -m lab.hpc.testbed up --sites 2 [--names a b] [--dir DIR] [--cpus 2 1] [--memory 6000]
    python -m lab.hpc.testbed status [--dir DIR]     # exit 0 if every recorded daemon is alive, else 1
    python -m lab.hpc.testbed down [--dir DIR]

Python::

    with Testbed(tmp_dir) as tb:
        a, b = tb.up(2, cpus=[2, 1])
        sched = a.scheduler()            # a SlurmScheduler for site a

Errors (all :class:`TestbedError`, a :class:`~lab.hpc.errors.HPCError`):

* a Slurm binary is missing -> the message says ``apt-get install slurm-wlm``;
* a daemon exits while starting, or the node does not become idle within
  ``timeout_s`` -> the message carries the tail of the daemon's log;
  everything started so far is stopped again;
* ``up`` on a directory whose recorded daemons are still alive -> says to run
  ``down`` first;
* invalid site names, counts, CPU or memory values.

``down`` stops exactly the recorded daemons (SIGTERM, then SIGKILL to the
daemon's process group after ``grace_s``), tolerates PIDs that are already dead
(a recorded PID is only signalled while ``/proc/PID/cmdline`` still names the
site's slurm.conf, so a recycled PID is never hit), also ends job step daemons
(``slurmstepd``) still serving the site's jobs, and removes the state file.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lab.hpc.errors import HPCError, TestbedError  # TestbedError is defined in lab.hpc.errors, importable from here as before

__all__ = ["Testbed", "TestbedSite", "TestbedError", "default_dir", "main"]

INSTALL_HINT = "install Slurm with `apt-get install -y --no-install-recommends slurm-wlm` (Debian/Ubuntu)"
STATE_FILE = "testbed.json"
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_DAEMONS = ("slurmctld", "slurmd")


def default_dir() -> Path:
    """``$LAB_TESTBED_DIR`` if set, else ``~/.cache/research-lab/testbed``."""
    env = os.environ.get("LAB_TESTBED_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "research-lab" / "testbed"


@dataclass
class TestbedSite:
    """One running site: its name (= Slurm ``ClusterName``), configuration and daemons.

    ``ports`` and ``pids`` are keyed by daemon (``"slurmctld"``, ``"slurmd"``);
    ``memory_mb`` is the node's ``RealMemory`` in megabytes.
    """

    __test__ = False  # not a pytest test class

    name: str
    conf: Path
    dir: Path
    ports: dict[str, int]
    pids: dict[str, int]
    node: str = ""
    cpus: int = 2
    memory_mb: int = 6000

    @property
    def jobcomp(self) -> Path:
        """The jobcomp/filetxt file (one ``key=value`` line per finished job)."""
        return self.dir / "jobcomp.log"

    def env(self) -> dict[str, str]:
        """A copy of ``os.environ`` with ``SLURM_CONF`` pointing at this site (for ``subprocess`` calls)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def scheduler(self, **kwargs):
        """A :class:`~lab.hpc.schedulers.slurm.SlurmScheduler` for this site (``kwargs`` go to it)."""
        from lab.hpc.schedulers.slurm import SlurmScheduler

        return SlurmScheduler(self.name, self.conf, **kwargs)

    def site(self):
        """The :class:`~lab.hpc.sites.Site` description of this site (partitions as in its slurm.conf:
        ``debug``, 1 node, 1 hour, the default; ``long``, 1 node, 1 day; data endpoint ``DIR/data``)."""
        from lab.hpc.sites import DataEndpoint, Partition, Site

        return Site(
            name=self.name,
            scheduler="slurm",
            slurm_conf=self.conf,
            description=f"local Slurm testbed site ({self.cpus} CPUs)",
            partitions=[
                Partition(name="debug", max_nodes=1, max_walltime_s=3600, cpus_per_node=self.cpus, default=True),
                Partition(name="long", max_nodes=1, max_walltime_s=86400, cpus_per_node=self.cpus),
            ],
            data=DataEndpoint(kind="local", path=str(self.dir / "data")),
        )

    def to_json(self) -> dict:
        d = asdict(self)
        d["conf"], d["dir"] = str(self.conf), str(self.dir)
        return d

    @classmethod
    def from_json(cls, d: dict) -> TestbedSite:
        return cls(**{**d, "conf": Path(d["conf"]), "dir": Path(d["dir"])})


# --------------------------------------------------------------------------- process helpers


def _require_binaries() -> dict[str, str]:
    found, missing = {}, []
    for b in ("slurmctld", "slurmd", "sinfo", "scontrol", "scancel", "squeue"):
        path = shutil.which(b) or next((p for p in (f"/usr/sbin/{b}", f"/usr/bin/{b}") if os.access(p, os.X_OK)), None)
        if path is None:
            missing.append(b)
        else:
            found[b] = path
    if missing:
        raise TestbedError(f"Slurm is not installed here ({', '.join(missing)} not found on PATH or in /usr/sbin): {INSTALL_HINT}")
    return found


def _proc_state(pid: int) -> str | None:
    """The one-letter state from /proc/PID/stat (``Z`` zombie), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return data[data.rfind(")") + 2 :].split()[0]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _is_ours(pid: int | None, conf: Path) -> bool:
    """True while ``pid`` is a live (non-zombie) process whose command line names ``conf``."""
    if not pid:
        return False
    state = _proc_state(pid)
    if state is None or state in "ZX":
        _reap(pid)
        return False
    return str(conf) in _cmdline(pid)


def _reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is our child (no-op otherwise)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        pass


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} not readable)"
    keep = [t for t in text if t.strip()][-lines:]
    return "\n".join(keep) if keep else f"({path} is empty)"


def _free_ports(n: int, taken: set[int]) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1 that are free now (the kernel's ephemeral choice)."""
    ports: list[int] = []
    socks = []
    try:
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            p = s.getsockname()[1]
            if p not in taken and p not in ports:
                ports.append(p)
    finally:
        for s in socks:
            s.close()
    return ports


def _stepd_sessions(site_dir: Path) -> set[int]:
    """Session ids of ``slurmstepd`` processes that serve this site (an open fd into ``site_dir``).

    A ``slurmstepd`` keeps the site's slurmd log open and listens on a Unix socket in the
    site's spool directory; either identifies the site.
    """
    prefix = str(site_dir.resolve()) + os.sep
    socket_inodes: set[str] = set()
    try:
        with open("/proc/net/unix") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 8 and parts[7].startswith(prefix):
                    socket_inodes.add(parts[6])
    except OSError:
        pass
    sessions: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "slurmstepd":
                    continue
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(prefix) or (target.startswith("socket:[") and target[8:-1] in socket_inodes):
                try:
                    sessions.add(os.getsid(pid))
                except ProcessLookupError:
                    pass
                break
    return sessions


def _kill_sessions(sessions: set[int]) -> None:
    """SIGKILL every process whose session id is in ``sessions``."""
    if not sessions:
        return
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            pid = int(entry)
            try:
                if os.getsid(pid) in sessions:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


# --------------------------------------------------------------------------- configuration


def render_conf(
    name: str,
    site_dir: Path,
    *,
    node: str,
    hostname: str,
    ctld_port: int,
    slurmd_port: int,
    cpus: int,
    memory_mb: int,
    user: str,
) -> str:
    """The slurm.conf text of one site (every path inside ``site_dir``)."""
    d = site_dir
    return f"""\
# research-lab testbed site {name!r}: written by lab.hpc.testbed, do not edit while running
ClusterName={name}
SlurmctldHost={hostname}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/none
CredType=cred/none
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.log
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
SlurmdParameters=config_overrides
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
MinJobAge=600
NodeName={node} NodeHostname={hostname} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=01:00:00 State=UP
PartitionName=long Nodes=ALL Default=NO MaxTime=1-00:00:00 State=UP
"""


# --------------------------------------------------------------------------- the testbed


@dataclass
class _Started:
    site: TestbedSite
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)


class Testbed:
    """Start, inspect and stop a set of local Slurm sites under one directory.

    Parameters
    ----------
    dir : path, optional
        Where the sites and ``testbed.json`` live (default :func:`default_dir`).
    timeout_s : float
        How long ``up`` waits for each site's node to become idle, and each client
        command may take (seconds).
    grace_s : float
        How long ``down`` waits after SIGTERM before it sends SIGKILL (seconds).
    """

    __test__ = False  # not a pytest test class

    def __init__(self, dir: Path | str | None = None, *, timeout_s: float = 30.0, grace_s: float = 10.0):
        self.dir = Path(dir).expanduser().resolve() if dir is not None else default_dir().resolve()
        self.timeout_s, self.grace_s = float(timeout_s), float(grace_s)
        self._procs: dict[int, subprocess.Popen] = {}  # our children, reaped on stop

    # ---- state file
    @property
    def state_file(self) -> Path:
        return self.dir / STATE_FILE

    def _load(self) -> list[TestbedSite]:
        try:
            data = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as e:
            raise TestbedError(f"{self.state_file}: unreadable testbed state ({e}); stop the daemons by hand and delete it") from e
        return [TestbedSite.from_json(s) for s in data.get("sites", [])]

    def _save(self, sites: list[TestbedSite]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"version": 1, "dir": str(self.dir), "sites": [s.to_json() for s in sites]}, indent=2) + "\n")
        tmp.replace(self.state_file)

    @property
    def sites(self) -> list[TestbedSite]:
        """The sites recorded in the state file (empty when the testbed is down)."""
        return self._load()

    def site(self, name: str) -> TestbedSite:
        """The recorded site called ``name``."""
        for s in self._load():
            if s.name == name:
                return s
        raise TestbedError(f"no site {name!r} in {self.state_file} (sites: {[s.name for s in self._load()]})")

    # ---- up
    def up(
        self,
        sites: int | Sequence[str] = 2,
        *,
        cpus: int | Sequence[int] = 2,
        memory_mb: int | Sequence[int] = 6000,
        compute_nice: int = 0,
    ) -> list[TestbedSite]:
        """Start ``sites`` sites (a count, named ``site0``.., or a list of names) and wait until each is idle.

        ``cpus`` and ``memory_mb`` (megabytes) are one value for every site or one per site.
        ``compute_nice`` (0..19) runs each node daemon, and so every job and job step daemon it starts,
        at that nice value: on a real site the jobs run on compute nodes, not beside the controllers and
        the client that watches them; on a small machine a niced node gives the controllers and the
        client the CPU first, as separate hardware would (the jobs still get every idle cycle).
        Returns the started sites, in order. Raises :class:`TestbedError` (everything started
        so far is stopped again).
        """
        names = [f"site{i}" for i in range(sites)] if isinstance(sites, int) else list(sites)
        if isinstance(sites, int) and sites < 1:
            raise TestbedError(f"sites must be at least 1, got {sites}")
        if not names:
            raise TestbedError("no site names given")
        for n in names:
            if not isinstance(n, str) or not _NAME_RE.match(n):
                raise TestbedError(
                    f"site name {n!r} is invalid: use 1-32 lower-case letters, digits or '_', starting with a letter "
                    "(Slurm lower-cases ClusterName)"
                )
        if len(set(names)) != len(names):
            raise TestbedError(f"site names must be unique, got {names}")
        if not isinstance(compute_nice, int) or not 0 <= compute_nice <= 19:
            raise TestbedError(f"compute_nice must be an integer nice value 0..19, got {compute_nice!r}")
        cpu_list = self._per_site("cpus", cpus, len(names))
        mem_list = self._per_site("memory_mb", memory_mb, len(names))
        for c, m in zip(cpu_list, mem_list):
            if c < 1:
                raise TestbedError(f"cpus must be >= 1 per site, got {c}")
            if m < 500 * c:
                raise TestbedError(f"memory_mb must be >= 500 MB per CPU (DefMemPerCPU=500), got {m} MB for {c} CPUs")

        bins = _require_binaries()
        alive = [s.name for s in self._load() if any(_is_ours(p, s.conf) for p in s.pids.values())]
        if alive:
            raise TestbedError(
                f"a testbed is already running in {self.dir} (sites {alive}); stop it first: python -m lab.hpc.testbed down --dir {self.dir}"
            )

        hostname = socket.gethostname().split(".")[0]
        user = getpass.getuser()
        taken: set[int] = set()
        started: list[_Started] = []
        try:
            for name, c, m in zip(names, cpu_list, mem_list):
                site_dir = self.dir / name
                # slurmstepd listens on <spool>/<node>_<job>.<step>; a Unix socket path has at most 107 bytes
                longest = len(os.fsencode(site_dir / "spool" / f"{name}n0_9999999.4294967291"))
                if longest > 107:
                    raise TestbedError(
                        f"testbed directory {self.dir} is too long: job step sockets under it would need {longest} bytes "
                        "(Unix sockets allow 107); use a shorter --dir"
                    )
                self._fresh_site_dir(site_dir)
                ctld_port, slurmd_port = _free_ports(2, taken)
                taken |= {ctld_port, slurmd_port}
                node = f"{name}n0"
                conf = site_dir / "slurm.conf"
                conf.write_text(
                    render_conf(name, site_dir, node=node, hostname=hostname, ctld_port=ctld_port, slurmd_port=slurmd_port, cpus=c, memory_mb=m, user=user)
                )
                site = TestbedSite(name, conf, site_dir, {"slurmctld": ctld_port, "slurmd": slurmd_port}, {}, node=node, cpus=c, memory_mb=m)
                started.append(_Started(site))
            # all controllers first, then all node daemons: a slurmd that starts before its
            # controller listens only retries its registration later
            for st in started:
                self._spawn(st, "slurmctld", [bins["slurmctld"], "-D", "-i", "-f", str(st.site.conf)])
                self._save([s.site for s in started])
            for st in started:
                self._wait(st, "slurmctld", lambda s: self._ping(s), "answer `scontrol ping`")
            for st in started:
                self._spawn(st, "slurmd", [bins["slurmd"], "-D", "-N", st.site.node, "-f", str(st.site.conf)], nice=compute_nice)
                self._save([s.site for s in started])
            for st in started:
                self._wait(st, "slurmd", lambda s: self._node_state(s) == "idle", "show its node idle in `sinfo`")
        except BaseException:
            self._stop([s.site for s in started])
            self.state_file.unlink(missing_ok=True)
            raise
        sites_out = [s.site for s in started]
        self._save(sites_out)
        self.write_site_files(sites_out)
        return sites_out

    @property
    def sites_dir(self) -> Path:
        """``DIR/sites``: one :class:`~lab.hpc.sites.Site` TOML file per running site (for
        :func:`lab.hpc.sites.load_sites`, the continuation service and the MCP server)."""
        return self.dir / "sites"

    def write_site_files(self, sites: Sequence[TestbedSite]) -> Path:
        from lab.hpc.sites import write_site

        self.sites_dir.mkdir(parents=True, exist_ok=True)
        for old in self.sites_dir.glob("*.toml"):
            old.unlink()
        for site in sites:
            (site.dir / "data").mkdir(parents=True, exist_ok=True)
            write_site(site.site(), self.sites_dir / f"{site.name}.toml")
        return self.sites_dir

    @staticmethod
    def _per_site(what: str, value, n: int) -> list[int]:
        if isinstance(value, int):
            return [value] * n
        vals = [int(v) for v in value]
        if len(vals) == 1:
            return vals * n
        if len(vals) != n:
            raise TestbedError(f"{what}: give one value or one per site ({n}), got {len(vals)}: {vals}")
        return vals

    @staticmethod
    def _fresh_site_dir(site_dir: Path) -> None:
        """Create ``site_dir`` and remove what an earlier run of ours left in it (state, spool, logs)."""
        for sub in ("state", "spool", "log", "run"):
            shutil.rmtree(site_dir / sub, ignore_errors=True)
            (site_dir / sub).mkdir(parents=True, exist_ok=True)
        for f in ("jobcomp.log", "slurm.conf"):
            (site_dir / f).unlink(missing_ok=True)

    def _spawn(self, st: _Started, daemon: str, argv: list[str], *, nice: int = 0) -> None:
        out = open(st.site.dir / "log" / f"{daemon}.out", "ab")
        if nice:  # nice(1) execs the daemon: same pid, and every thread and child it starts inherits the value
            argv = [shutil.which("nice") or "/usr/bin/nice", "-n", str(nice), *argv]
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=st.site.env(),
                cwd=st.site.dir,
                start_new_session=True,
            )
        except OSError as e:
            raise TestbedError(f"site {st.site.name!r}: cannot start {daemon} ({e}); {INSTALL_HINT}") from e
        finally:
            out.close()
        st.procs[daemon] = proc
        st.site.pids[daemon] = proc.pid
        self._procs[proc.pid] = proc

    def _wait(self, st: _Started, daemon: str, ready, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            for d, proc in st.procs.items():
                if proc.poll() is not None:
                    raise TestbedError(
                        f"site {st.site.name!r}: {d} exited with status {proc.returncode} while starting; "
                        f"last lines of its log:\n{self._logs(st.site, d)}"
                    )
            if ready(st.site):
                return
            if time.monotonic() > deadline:
                raise TestbedError(
                    f"site {st.site.name!r}: {daemon} did not {what} within {self.timeout_s:g} s "
                    f"(node state {self._node_state(st.site)!r}); last lines of its log:\n{self._logs(st.site, daemon)}"
                )
            time.sleep(0.1)

    @staticmethod
    def _logs(site: TestbedSite, daemon: str) -> str:
        log, out = site.dir / "log" / f"{daemon}.log", site.dir / "log" / f"{daemon}.out"
        return f"--- {log}\n{_tail(log)}\n--- {out}\n{_tail(out, 5)}"

    def _client(self, site: TestbedSite, argv: list[str], timeout: float | None = None) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run(argv, env=site.env(), capture_output=True, text=True, timeout=timeout or self.timeout_s)
        except (subprocess.TimeoutExpired, OSError):
            return None

    def _ping(self, site: TestbedSite) -> bool:
        r = self._client(site, ["scontrol", "ping"], timeout=5)
        return r is not None and r.returncode == 0 and "UP" in r.stdout

    def _node_state(self, site: TestbedSite) -> str | None:
        r = self._client(site, ["sinfo", "-h", "-N", "-n", site.node, "-o", "%T"], timeout=5)
        if r is None or r.returncode != 0:
            return None
        states = r.stdout.split()
        return states[0] if states else None

    # ---- status / stop
    def status(self) -> dict[str, dict[str, bool]]:
        """``{site: {"slurmctld": alive, "slurmd": alive}}`` for every recorded site."""
        return {s.name: {d: _is_ours(s.pids.get(d), s.conf) for d in _DAEMONS} for s in self._load()}

    def stop_site(self, name: str) -> None:
        """Stop one site's ``slurmctld`` only (its slurmd keeps running): a controller outage, for fault tests.

        The PID stays recorded, so ``down`` still handles the site (and finds it dead).
        """
        site = self.site(name)
        self._terminate([(site, "slurmctld")])

    def down(self) -> list[str]:
        """Stop every recorded daemon and the job steps of the sites; remove the state file.

        Returns the names of the sites that were recorded. Already-dead PIDs are fine.
        """
        sites = self._load()
        self._stop(sites)
        self.state_file.unlink(missing_ok=True)
        return [s.name for s in sites]

    def _stop(self, sites: list[TestbedSite]) -> None:
        # cancel running jobs while the controllers still answer (their steps end cleanly) ...
        for s in sites:
            if _is_ours(s.pids.get("slurmctld"), s.conf) and _is_ours(s.pids.get("slurmd"), s.conf):
                r = self._client(s, ["squeue", "-h", "-o", "%i"], timeout=5)
                ids = r.stdout.split() if r is not None and r.returncode == 0 else []
                if ids:
                    self._client(s, ["scancel", "--quiet", *ids], timeout=5)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(_stepd_sessions(s.dir) for s in sites):
            time.sleep(0.1)
        # ... then the node daemons while their controllers still answer (a slurmd whose controller
        # is gone retries its goodbye for ~MessageTimeout: it gets 1 s), then the controllers,
        # and last any step daemon (and its job) that is still around
        orphans = [s for s in sites if not _is_ours(s.pids.get("slurmctld"), s.conf)]
        self._terminate([(s, "slurmd") for s in sites if s not in orphans])
        self._terminate([(s, "slurmd") for s in orphans], grace_s=1.0)
        self._terminate([(s, "slurmctld") for s in sites])
        for s in sites:
            _kill_sessions(_stepd_sessions(s.dir))

    def _terminate(self, targets: list[tuple[TestbedSite, str]], grace_s: float | None = None) -> None:
        live = []
        for site, daemon in targets:
            pid = site.pids.get(daemon)
            if _is_ours(pid, site.conf):
                pgid = _pgid(pid)
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
                live.append((site, pid, pgid))
        deadline = time.monotonic() + (self.grace_s if grace_s is None else grace_s)
        while live and time.monotonic() < deadline:
            live = [t for t in live if _is_ours(t[1], t[0].conf)]
            if live:
                time.sleep(0.05)
        for site, pid, pgid in live:
            try:
                if pgid == pid:  # the daemon leads its own group (start_new_session): take its helpers too
                    os.killpg(pgid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for site, daemon in targets:
            pid = site.pids.get(daemon)
            if pid is not None:
                proc = self._procs.pop(pid, None)
                if proc is not None:
                    try:
                        proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                else:
                    _reap(pid)

    # ---- context manager
    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def __repr__(self) -> str:
        return f"Testbed({str(self.dir)!r})"


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lab.hpc.testbed {up,down,status}``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m lab.hpc.testbed", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd, help_ in (("up", "start the sites"), ("down", "stop every recorded daemon"), ("status", "show whether each recorded daemon is alive")):
        p = sub.add_parser(cmd, help=help_)
        p.add_argument("--dir", type=Path, default=None, help="testbed directory (default $LAB_TESTBED_DIR or ~/.cache/research-lab/testbed)")
        if cmd == "up":
            p.add_argument("--sites", type=int, default=None, help="number of sites, named site0..siteN-1 (default 2)")
            p.add_argument("--names", nargs="+", default=None, help="site names instead of --sites")
            p.add_argument("--cpus", type=int, nargs="+", default=[2], help="CPUs per site: one value or one per site (default 2)")
            p.add_argument("--memory", type=int, nargs="+", default=[6000], help="RealMemory in MB per site: one value or one per site (default 6000)")
            p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each site (default 30)")
    args = parser.parse_args(argv)
    tb = Testbed(args.dir, timeout_s=getattr(args, "timeout", 30.0))
    try:
        if args.cmd == "up":
            if args.names and args.sites is not None and args.sites != len(args.names):
                parser.error(f"--sites {args.sites} but {len(args.names)} --names")
            sites = tb.up(args.names or (args.sites if args.sites is not None else 2), cpus=args.cpus, memory_mb=args.memory)
            for s in sites:
                print(f"{s.name}\t{s.conf}\tcpus={s.cpus} memory={s.memory_mb}MB ports={s.ports['slurmctld']},{s.ports['slurmd']}")
            print(f"# site files: {tb.sites_dir}  (python -m lab.hpc.continuation serve --sites {tb.sites_dir} --db FILE)")
            print(f"# use a site: SLURM_CONF={sites[0].conf} sinfo    |  stop all: python -m lab.hpc.testbed down --dir {tb.dir}")
            return 0
        if args.cmd == "down":
            names = tb.down()
            print(f"stopped {len(names)} site(s): {' '.join(names)}" if names else f"no testbed recorded in {tb.dir}")
            return 0
        status = tb.status()
        if not status:
            print(f"no testbed recorded in {tb.dir}")
            return 1
        recorded = {s.name: s for s in tb.sites}
        for name, daemons in status.items():
            s = recorded[name]
            print(name + "\t" + "  ".join(f"{d} pid {s.pids.get(d)} {'alive' if ok else 'DEAD'}" for d, ok in daemons.items()) + f"\t{s.conf}")
        return 0 if all(all(d.values()) for d in status.values()) else 1
    except HPCError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
