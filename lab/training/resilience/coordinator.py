"""The coordinator of a hot-swap run: spawns N workers and the spares, detects and classifies failures,
re-forms the process group with a spare in the failed rank's logical place, picks the generation to resume.

What torch offers and what this adds
    torch 2.13 gives ``ProcessGroup.abort()`` / ``shutdown()`` (present on the gloo group too) and
    ``torch.distributed.destroy_process_group``; gloo itself surfaces a dead peer at once ("Connection
    closed/reset by peer", measured: 0.5 s after a SIGKILL) and a silent one as a timeout after the
    group's ``timeout``, so the workers here only ``destroy_process_group`` after the error (a rank
    raising a transient error does so too, which closes its sockets and wakes its peers at once
    instead of after the timeout); and a fresh rendezvous through any
    :class:`torch.distributed.Store` (here one :class:`~torch.distributed.TCPStore` the coordinator
    hosts, with a :class:`~torch.distributed.PrefixStore` per epoch so a new group never reads the
    dead group's addresses). It offers no membership service, no spare pool, no failure
    classification and no agreement on a recovery point: those are this module (the plan protocol in
    :mod:`lab.training.resilience.worker`'s docstring), plus the generation-numbered, checksummed
    ping-pong buffers of :mod:`lab.training.resilience.snapshot`.

Failure classification (after PHOENIX's "failure classification", ``../shared/notes/papers-phoenix.md``)
    ``killed``: a member process exited (its signal or code is named); ``hung``: alive, but it did not
    report within ``timeout_s + grace_s`` while the others' collectives failed; the coordinator then
    SIGKILLs it; ``transient``: every member is alive and reported (a collective error, no process
    lost): the same members re-form the group and roll back, no spare is used. Killed and hung ranks
    are replaced by a spare; with none left, :class:`NoSpareError`.

Resume point
    The newest generation committed in every survivor's local buffers *and* (for each replaced rank)
    valid in its replica holder's buffer (rank ``(r + 1) % N``; the holder re-verifies the CRC-32). A
    replica failing its checksum is reported (rank and generation named, event ``train.replica``) and
    never loaded; with no usable generation the run falls back to the newest complete disk checkpoint
    (or the initial state).

Zero completed steps lost (replay)
    Generations go to the peer every ``k`` steps (``ResilienceConfig.replica_interval``), and a rank can
    also be killed after optimizer step ``t`` but before its generation reached the peer (mid snapshot,
    before the transfer, right after the step). Either way the holder's newest replica ``R`` of the lost
    rank can be behind the survivors' committed generations (by up to ``k + 1`` steps); resuming at ``R``
    would redo steps every rank had completed, and the survivors' local buffers hold only their last two
    generations. The holder therefore also keeps its predecessor's shard of the averaged gradient of every
    step since (gloo's all-reduce leaves identical bytes on every rank, so it is the gradient the lost
    rank used), and the lost shard's generation ``g`` is rebuilt by running the same AdamW updates
    ``R + 1 .. g`` on replica ``R`` with them -- bit-identical, no step recomputed by anyone. It is used
    only when the holder's own RNG state did not change since ``R`` (the program drew no random numbers;
    every rank runs the same program, so the lost rank's RNG state at ``g`` is the one in replica ``R``).
    Otherwise the run resumes at the newest generation some replica reaches, or from disk; ``k = 1``
    then costs at most one completed step recomputed, 0 *committed* generations lost (PHOENIX commits a
    generation when its local copy and its peer copy are both complete).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from lab.training.errors import TrainingError
from lab.training.resilience.config import ResilienceConfig

__all__ = ["FailureRecord", "NoSpareError", "RecoveryError", "ResilientRun", "RunOutcome", "run_resilient"]

KIND_FAILURE, KIND_SWAP, KIND_RECOVERY, KIND_REPLICA = "train.failure", "train.swap", "train.recovery", "train.replica"


class RecoveryError(TrainingError):
    """A hot-swap run could not recover (the message says why)."""


class NoSpareError(RecoveryError):
    """A rank failed permanently and no spare process is left to take its place."""


@dataclass
class FailureRecord:
    """One failure and its recovery (times in seconds, wall clock).

    Attributes
    ----------
    rank, worker, pid : int
        The failed logical rank, the worker id and process id that held it (for ``transient``, the
        rank that raised).
    kind : str
        ``killed``, ``hung`` or ``transient``.
    replacement : int or None
        The spare's worker id that took the rank (None for ``transient``).
    generation : int
        The generation (step) resumed from; ``restore`` is ``memory``, ``disk`` or ``fresh``.
    replayed : bool
        The lost rank's shard of ``generation`` was rebuilt by replaying optimizer steps ``replayed_from + 1
        .. generation`` on its replica of ``replayed_from`` with the gradient shards its replica holder kept
        (see the module docstring, "Resume point").
    replayed_from : int or None
        The replica generation the replay started from (None: no replay).
    last_step : int
        The last step rank 0 completed before the failure.
    detection_s, rebuild_s, restore_s, recompute_s, recovery_s : float
        Kill (or first report) -> coordinator decided; -> every rank's new group formed; -> state
        restored; -> the step after ``last_step`` completed again. ``recovery_s`` is their sum.
    """

    rank: int
    worker: int
    pid: int | None
    kind: str
    detail: str
    last_step: int
    generation: int = -1
    restore: str = ""
    replacement: int | None = None
    replacement_pid: int | None = None
    detection_s: float = float("nan")
    rebuild_s: float = float("nan")
    restore_s: float = float("nan")
    recompute_s: float = float("nan")
    recovery_s: float = float("nan")
    replica_problems: list[str] = field(default_factory=list)
    replayed: bool = False
    replayed_from: int | None = None
    t_fail: float = 0.0

    @property
    def steps_lost(self) -> int:
        """Completed steps whose work had to be recomputed (``last_step - generation``)."""
        return max(0, self.last_step - self.generation)


@dataclass
class RunOutcome:
    """What a finished hot-swap run returns (from rank 0's final report unless said otherwise)."""

    param_sha256: str
    step: int
    losses: dict[int, float]
    step_s: dict[int, float]
    protected: dict[int, bool]
    failures: list[FailureRecord]
    maxrss_kb: dict[int, int]
    members: dict[int, int]
    snapshot_busy_s: float
    wall_s: float
    iter_s: dict[int, float] = field(default_factory=dict)
    snapshot_cpu_s: dict[int, dict[str, float]] = field(default_factory=dict)
    snapshot_generations: dict[int, int] = field(default_factory=dict)
    #: per worker, per step: the process's CPU seconds (user + system, all threads) over the loop iteration
    iter_cpu_s: dict[int, dict[int, float]] = field(default_factory=dict)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_CTX: Any = None


def _context():
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["torch", "torch.distributed", "lab.training.model", "lab.training.data",
                                     "lab.training.resilience.worker"])
    return _CTX


class ResilientRun:
    """Run a hot-swap job in the background; :meth:`kill` a rank from outside, :meth:`wait` for the outcome.

    Parameters
    ----------
    config : ResilienceConfig

    Notes
    -----
    Workers are ``multiprocessing`` processes from a forkserver that has imported torch once (so the
    spares and the ranks start in about a second); each sets ``PR_SET_PDEATHSIG`` so none outlives
    the coordinator.
    """

    def __init__(self, config: ResilienceConfig):
        self.cfg = config
        self.port = _free_port()
        self.store = dist.TCPStore("127.0.0.1", self.port, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=config.store_timeout_s))
        self.procs: dict[int, Any] = {}
        self.members: dict[int, int] = {r: r for r in range(config.workers)}
        self.spares: list[int] = list(range(config.workers, config.workers + config.spares))
        self.failures: list[FailureRecord] = []
        self.outcome: RunOutcome | None = None
        self.error: BaseException | None = None
        self.epoch = 0
        self._external_kills: dict[int, float] = {}
        self._thread: threading.Thread | None = None
        self._log = None
        if config.events_path is not None:
            from lab.training.monitor import open_log

            self._log = open_log(config.events_path)
        self.t_start = time.time()

    # ------------------------------------------------------------------ public
    def start(self) -> ResilientRun:
        """Spawn the workers and the spares and start supervising in a background thread."""
        Path(self.cfg.run_dir).mkdir(parents=True, exist_ok=True)
        for w in range(self.cfg.workers + self.cfg.spares):
            self._spawn(w)
        self._event("train.resilience", {
            "workers": self.cfg.workers, "spares": self.spares, "members": self.members,
            "pids": {w: p.pid for w, p in self.procs.items()}})
        self._post_plan(0, {"restore": "fresh", "generation": 0, "new_ranks": [], "src": 0})
        self._thread = threading.Thread(target=self._supervise_safe, name="resilience-coordinator", daemon=True)
        self._thread.start()
        return self

    def pid_of(self, rank: int) -> int:
        """Process id of the worker holding logical rank ``rank`` now."""
        return self.procs[self.members[rank]].pid

    def kill(self, rank: int, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to the process holding logical ``rank`` (the fault-injection of the benchmark and
        the notebook); returns its pid."""
        w = self.members[rank]
        self._external_kills[w] = time.time()
        pid = self.procs[w].pid
        os.kill(pid, sig)
        return pid

    def progress(self) -> dict:
        """Rank 0's last completed step ``{"epoch", "step", "time"}`` (empty before the first)."""
        if not self.store.check(["progress"]):
            return {}
        return json.loads(self.store.get("progress"))

    def wait(self, timeout: float | None = None) -> RunOutcome:
        """Block until the run ends; returns its :class:`RunOutcome`.

        Raises
        ------
        NoSpareError, RecoveryError
            The run could not recover (every worker is stopped before this is raised).
        TimeoutError
            ``timeout`` passed first (the run keeps going; call :meth:`close` to end it).
        """
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"hot-swap run {self.cfg.resolved_run_id} still running after {timeout} s")
        if self.error is not None:
            raise self.error
        return self.outcome

    def close(self) -> None:
        """Stop every worker (SIGKILL what is left after a short grace)."""
        try:
            if not self.store.check(["fatal"]):
                self.store.set("fatal", "closed")
        except Exception:
            pass
        t_end = time.time() + 2.0
        for p in self.procs.values():
            p.join(max(0.0, t_end - time.time()))
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
                p.join(1.0)
        if self._log is not None:
            self._log.close()
            self._log = None

    # ------------------------------------------------------------------ internals
    def _spawn(self, w: int) -> None:
        from lab.training.resilience.worker import worker_main

        p = _context().Process(target=worker_main, args=(self.cfg.model_dump_json(), w, self.port), name=f"resilience-w{w}",
                               daemon=True)
        p.start()
        self.procs[w] = p

    def _event(self, kind: str, payload: dict) -> None:
        if self._log is not None:
            self._log.append("coordinator", kind, self.cfg.resolved_run_id, payload)

    def _get(self, key: str) -> Any:
        return json.loads(self.store.get(key))

    def _post_plan(self, epoch: int, plan: dict) -> None:
        plan = {"epoch": epoch, "members": {str(r): w for r, w in self.members.items()}, **plan}
        self.store.set(f"plan/{epoch}", json.dumps(plan))

    def _supervise_safe(self) -> None:
        try:
            self.outcome = self._supervise()
        except BaseException as exc:  # noqa: BLE001 - handed to wait()
            self.error = exc
            try:
                self.store.set("fatal", f"{type(exc).__name__}: {exc}")
            except Exception:
                pass
        finally:
            self.close()

    def _keys(self, prefix: str, workers) -> dict[int, Any]:
        out = {}
        for w in workers:
            key = f"{prefix}/{w}"
            if self.store.check([key]):
                out[w] = self._get(key)
        return out

    def _supervise(self) -> RunOutcome:
        cfg = self.cfg
        pending: list[FailureRecord] = []  # failures whose recovery is still being timed
        while True:
            epoch, members = self.epoch, dict(self.members)
            workers = list(members.values())
            first_seen = None
            while True:
                time.sleep(0.01)
                self._finish_timing(pending, epoch)
                done = self._keys(f"done/{epoch}", workers)
                if len(done) == len(workers):
                    self._finish_timing(pending, epoch, final=True)
                    self.store.set(f"plan/{epoch + 1}", json.dumps({"restore": "stop"}))
                    out0 = done[members[0]]
                    return RunOutcome(
                        param_sha256=out0["sha"], step=out0["step"],
                        losses={int(k): v for k, v in out0["losses"].items()},
                        step_s={int(k): v for k, v in out0["step_s"].items()},
                        protected={int(k): v for k, v in out0["protected"].items()},
                        failures=self.failures, maxrss_kb={w: d["maxrss_kb"] for w, d in done.items()},
                        members=dict(self.members), snapshot_busy_s=out0["snapshot_busy_s"], wall_s=time.time() - self.t_start,
                        iter_s={int(k): v for k, v in out0["iter_s"].items()},
                        snapshot_cpu_s={w: d["snapshot_cpu_s"] for w, d in done.items()},
                        snapshot_generations={w: d["snapshot_generations"] for w, d in done.items()},
                        iter_cpu_s={w: {int(k): v for k, v in d["iter_cpu_s"].items()} for w, d in done.items()})
                dead = {w: self.procs[w].exitcode for w in workers if self.procs[w].exitcode is not None}
                reports = self._keys(f"report/{epoch}", workers)
                if not dead and not reports:
                    continue
                now = time.time()
                first_seen = first_seen or now
                silent = [w for w in workers if w not in dead and w not in reports]
                # a survivor whose collective failed reports within grace_s; one that stays silent that long
                # after the others reported (or timeout_s + grace_s after a death) is hung
                if silent and now - first_seen < cfg.grace_s + (0.0 if reports else cfg.timeout_s):
                    continue
                break
            t_decided = time.time()
            progress = self.progress()
            last_step = progress.get("step", 0) if progress.get("epoch", epoch) <= epoch else 0
            failed: dict[int, tuple[str, str]] = {}
            for w, code in dead.items():
                failed[w] = ("killed", f"exit code {code}" + (f" ({signal.Signals(-code).name})" if code < 0 else ""))
            for w in silent:
                failed[w] = ("hung", f"no progress and no report within {cfg.timeout_s + cfg.grace_s:.1f} s; SIGKILLed")
                self.procs[w].kill()
            rank_of = {w: r for r, w in members.items()}
            if not failed:
                origin = [w for w, rep in reports.items() if rep["kind"] == "transient"] or list(reports)[:1]
                failed_t = {origin[0]: ("transient", reports[origin[0]]["error"])}
            else:
                failed_t = {}
            records = []
            for w, (kind, detail) in {**failed, **failed_t}.items():
                t_fail = self._kill_time(w, first_seen)
                rec = FailureRecord(rank=rank_of[w], worker=w, pid=self.procs[w].pid, kind=kind, detail=detail,
                                    last_step=last_step, t_fail=t_fail, detection_s=t_decided - t_fail)
                records.append(rec)
                self._event(KIND_FAILURE, {"rank": rec.rank, "worker": w, "pid": rec.pid, "kind": kind, "detail": detail,
                                           "step": last_step, "epoch": epoch, "detection_s": rec.detection_s})
            # ---- replacements
            new_ranks = []
            for rec in records:
                if rec.kind == "transient":
                    continue
                if not self.spares:
                    used = [f"worker {f.replacement} took rank {f.rank} after the {f.kind} of worker {f.worker}"
                            for f in self.failures if f.replacement is not None]
                    msg = (f"rank {rec.rank} (worker {rec.worker}, pid {rec.pid}) failed ({rec.kind}: {rec.detail}) after step "
                           f"{last_step} and no spare is left: the run had {cfg.spares} spare(s)"
                           + (f"; {'; '.join(used)}" if used else "") + ". Add spares or restart from the disk checkpoint.")
                    self._event(KIND_FAILURE, {"rank": rec.rank, "kind": "no_spare", "detail": msg})
                    raise NoSpareError(msg)
                spare = self.spares.pop(0)
                if self.procs[spare].exitcode is not None:
                    raise RecoveryError(f"spare worker {spare} died (exit code {self.procs[spare].exitcode}) before it was needed")
                rec.replacement, rec.replacement_pid = spare, self.procs[spare].pid
                self.members[rec.rank] = spare
                new_ranks.append(rec.rank)
                if cfg.replenish:
                    self._spawn(max(self.procs) + 1)
                    self.spares.append(max(self.procs))
            # ---- the resume point
            survivors = {r: w for r, w in members.items() if w not in failed}
            plan = self._choose_generation(survivors, reports, new_ranks, records)
            for rec in records:
                rec.generation, rec.restore = plan["generation"], plan["restore"]
                rec.replayed = rec.rank in plan.get("replay", [])
                rec.replayed_from = plan.get("replay_from", {}).get(str(rec.rank))
                if rec.replacement is not None:
                    self._event(KIND_SWAP, {"rank": rec.rank, "old_worker": rec.worker, "old_pid": rec.pid,
                                            "new_worker": rec.replacement, "new_pid": rec.replacement_pid,
                                            "generation": plan["generation"], "restore": plan["restore"], "epoch": epoch + 1})
            self.failures.extend(records)
            pending.extend(records)
            self.epoch = epoch + 1
            self._t_plan = time.time()
            self._post_plan(self.epoch, plan)

    def _kill_time(self, w: int, fallback: float) -> float:
        if w in self._external_kills:
            return self._external_kills[w]
        key = f"killed_at/{w}"
        if self.store.check([key]):
            return self._get(key)["time"]
        return fallback

    def _choose_generation(self, survivors: dict[int, int], reports: dict[int, Any], new_ranks: list[int],
                           records: list[FailureRecord]) -> dict:
        cfg = self.cfg
        common = None
        for r, w in survivors.items():
            gens = set(reports.get(w, {}).get("local", []))
            common = gens if common is None else common & gens
        common = common or set()
        local_common = set(common)
        problems, replayable = [], {}
        for r in new_ranks:
            holder = (r + 1) % cfg.workers
            hw = survivors.get(holder)
            if hw is None:
                problems.append(f"the replica of rank {r} was on rank {holder}, which failed too")
                common = set()
                continue
            report = reports.get(hw, {})
            rep = report.get("replica", {})
            bad = sorted(int(g) for g, st in rep.items() if st != "ok")
            for g in bad:
                problems.append(f"replica of rank {r} generation {g} held by rank {holder} fails its CRC-32 check")
            if bad:
                common = set()  # silent corruption: do not trust the in-memory copies, go to disk
            ok = {int(g) for g, st in rep.items() if st == "ok"}
            # replay: generation g is rebuilt from replica R < g plus the holder's copies of rank r's averaged
            # gradient shards of steps R+1 .. g (when those steps drew no random numbers: the holder's RNG
            # state has not changed since generation R or earlier)
            kept, since = set(report.get("pred_grad_steps", [])), report.get("rng_static_since")
            source = {}  # generation -> the newest replica it can be rebuilt from
            for R in sorted(ok):
                source[R] = R
                s = R + 1
                while since is not None and since <= R and s in kept:
                    source[s] = R
                    s += 1
            replayable[r] = source
            common &= set(source)
            if not common and not bad:
                problems.append(f"no generation of rank {r}'s replica on rank {holder} matches the survivors' "
                                f"(replica: {sorted(rep)}, survivors: {sorted(local_common)})")
        for p in problems:
            self._event(KIND_REPLICA, {"problem": p})
        for rec in records:
            rec.replica_problems = problems
        src = min(survivors) if survivors else 0
        if common:
            g = max(common)
            replay_from = {str(r): replayable[r][g] for r in new_ranks if replayable.get(r, {}).get(g, g) < g}
            return {"restore": "memory", "generation": g, "new_ranks": new_ranks, "src": src,
                    "replay": sorted(int(r) for r in replay_from), "replay_from": replay_from}
        disk = sorted(int(d.name.removeprefix("step_")) for d in (Path(cfg.run_dir) / "checkpoints").glob("step_*")
                      if (d / "COMPLETE").is_file()) if (Path(cfg.run_dir) / "checkpoints").is_dir() else []
        if disk:
            return {"restore": "disk", "generation": disk[-1], "new_ranks": new_ranks, "src": src}
        return {"restore": "fresh", "generation": 0, "new_ranks": new_ranks, "src": src}

    def _finish_timing(self, pending: list[FailureRecord], epoch: int, final: bool = False) -> None:
        if not pending:
            return
        progress = self.progress()
        target = max(r.last_step for r in pending) + 1
        if progress.get("epoch") == epoch and progress.get("step", 0) >= target or final:
            timing = self._keys(f"timing/{epoch}", self.members.values())
            if len(timing) < len(self.members):
                return
            t_pg = max(t["pg_ready"] for t in timing.values())
            t_rest = max(t["restored"] for t in timing.values())
            t_step = progress.get("time", t_rest) if progress.get("epoch") == epoch else t_rest
            for r in pending:
                r.rebuild_s = t_pg - (r.t_fail + r.detection_s)
                r.restore_s = t_rest - t_pg
                r.recompute_s = max(0.0, t_step - t_rest)
                r.recovery_s = t_step - r.t_fail
                self._event(KIND_RECOVERY, {"rank": r.rank, "kind": r.kind, "generation": r.generation, "restore": r.restore,
                                            "detection_s": r.detection_s, "rebuild_s": r.rebuild_s, "restore_s": r.restore_s,
                                            "recompute_s": r.recompute_s, "recovery_s": r.recovery_s,
                                            "steps_lost": r.steps_lost})
            pending.clear()


def run_resilient(config: ResilienceConfig, timeout: float | None = None) -> RunOutcome:
    """Run a hot-swap job to the end (see :class:`ResilientRun`); raises what :meth:`ResilientRun.wait` raises."""
    run = ResilientRun(config).start()
    try:
        return run.wait(timeout)
    finally:
        run.close()
