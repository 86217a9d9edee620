"""lab.hpc's seams: schedulers found by name, close() on every Scheduler, the shared script helpers in
schedulers/base, transfer as a package, and every error a user can trigger typed under lab.hpc.errors."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import lab.hpc.errors as errors
from lab.hpc.errors import ArgumentError, HPCError, SiteError, UnknownSchedulerError
from lab.hpc.schedulers import base
from lab.hpc.schedulers.base import JobSpec, Scheduler, register_scheduler, scheduler_class, scheduler_names
from lab.hpc.schedulers.local import LocalScheduler
from lab.hpc.schedulers.slurm import SlurmScheduler
from lab.hpc.sites import Partition, Site, load_site

ROOT = Path(__file__).resolve().parents[1]

#: The modules in which no bare ValueError / KeyError / RuntimeError may be raised.
TYPED_MODULES = [
    "lab/hpc/queue.py",
    "lab/hpc/swf.py",
    "lab/hpc/sites.py",
    "lab/hpc/schedulers/base.py",
    "lab/hpc/schedulers/local.py",
    "lab/hpc/transfer/__init__.py",
    "lab/hpc/transfer/base.py",
    "lab/hpc/transfer/local.py",
    "lab/hpc/transfer/globus.py",
]
BARE = {"ValueError", "KeyError", "RuntimeError", "TypeError", "Exception"}


def _bare_raises(source: str) -> list[tuple[int, str]]:
    """(line, name) of every ``raise X(...)`` / ``raise X`` whose X is a built-in in :data:`BARE`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in BARE:
                found.append((node.lineno, exc.id))
    return sorted(found)


def test_the_scanner_finds_bare_raises():
    src = "def f(x):\n    if x:\n        raise ValueError('no')\n    raise KeyError\n\ndef g():\n    raise ArgumentError('f', 'x', 1, 'r')\n"
    assert _bare_raises(src) == [(3, "ValueError"), (4, "KeyError")]


@pytest.mark.parametrize("module", TYPED_MODULES)
def test_no_bare_builtin_error_is_raised(module):
    bare = _bare_raises((ROOT / module).read_text())
    assert not bare, f"{module} raises bare built-in errors at {bare}: use a lab.hpc.errors class naming the field"


# --------------------------------------------------------------------------- errors moved to lab.hpc.errors


@pytest.mark.parametrize(("module", "name", "bases"), [
    ("lab.hpc.placement", "PlacementError", (HPCError,)),
    ("lab.hpc.continuation", "ContinuationError", (HPCError,)),
    ("lab.hpc.testbed", "TestbedError", (HPCError, RuntimeError)),
])
def test_moved_errors_live_in_errors_and_still_import_from_their_modules(module, name, bases):
    cls = getattr(errors, name)
    assert getattr(importlib.import_module(module), name) is cls
    assert cls.__module__ == "lab.hpc.errors" and name in errors.__all__
    assert all(issubclass(cls, b) for b in bases)


def test_argument_error_names_where_field_and_value():
    err = ArgumentError("QueueReplay", "capacity", -3, "must be a positive integer")
    assert (err.where, err.field, err.value) == ("QueueReplay", "capacity", -3)
    assert str(err) == "QueueReplay: capacity=-3: must be a positive integer"
    assert isinstance(err, ValueError) and isinstance(err, HPCError)
    long = ArgumentError("f", "path", "x" * 100_000, "too long")
    assert len(str(long)) < 400  # a huge value is never echoed back whole


# --------------------------------------------------------------------------- scheduler registry


def _site(**kw) -> Site:
    return Site(name="alpha", scheduler=kw.pop("scheduler", "local"), partitions=[Partition(name="local", max_nodes=1, max_walltime_s=60, cpus_per_node=2)], **kw)


def test_builtin_schedulers_are_registered():
    assert {"local", "slurm"} <= set(scheduler_names())
    assert scheduler_class("local") is LocalScheduler and scheduler_class("slurm") is SlurmScheduler


def test_unknown_scheduler_lists_the_registered_ones(tmp_path):
    with pytest.raises(UnknownSchedulerError) as info:
        scheduler_class("pbs")
    assert info.value.name == "pbs" and info.value.registered == scheduler_names() and info.value.field == "scheduler"
    assert "registered: ['local', 'slurm']" in str(info.value) and isinstance(info.value, SiteError)
    path = tmp_path / "s.toml"
    path.write_text('name = "x"\nscheduler = "pbs"\n[[partitions]]\nname = "p"\nmax_nodes = 1\nmax_walltime_s = 60\ncpus_per_node = 1\n')
    with pytest.raises(UnknownSchedulerError) as info:
        load_site(path)
    assert info.value.path == path and info.value.field == "scheduler"


def test_a_registered_adapter_is_what_connect_builds(tmp_path, monkeypatch):
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))  # registrations made here end with the test

    @register_scheduler("fake")
    class FakeScheduler(LocalScheduler):
        built_for: list = []

        @classmethod
        def from_site(cls, site, *, workdir=None):
            cls.built_for.append((site.name, workdir))
            return cls(site.name, cpus=1, workdir=workdir)

    site = _site(scheduler="fake")
    with site.connect(workdir=tmp_path) as sched:  # the context manager closes it
        assert type(sched) is FakeScheduler and FakeScheduler.built_for == [("alpha", tmp_path)]
    assert sched._closed
    with pytest.raises(ArgumentError, match="already registered"):
        register_scheduler("fake")(LocalScheduler)
    with pytest.raises(ArgumentError, match="name='Bad Name'"):
        register_scheduler("Bad Name")
    with pytest.raises(ArgumentError, match="subclass of"):
        register_scheduler("other")(object)
    # a site built past validation whose adapter is gone: connect says so, listing what there is
    del base._REGISTRY["fake"]
    with pytest.raises(UnknownSchedulerError, match="'fake'"):
        site.connect(workdir=tmp_path)


def test_connect_builds_the_builtin_adapters(tmp_path):
    with _site(data={"path": str(tmp_path)}).connect() as local:
        assert isinstance(local, LocalScheduler) and local.cpus == 2 and local.workdir == tmp_path.resolve()
    slurm = _site(scheduler="slurm", slurm_conf=tmp_path / "slurm.conf").connect()
    assert isinstance(slurm, SlurmScheduler) and slurm.slurm_conf == tmp_path / "slurm.conf"


def test_close_is_part_of_the_abstract_interface(tmp_path):
    assert "close" in Scheduler.__dict__ and "__enter__" in Scheduler.__dict__

    class Minimal(Scheduler):  # implements only the abstract methods: close() comes from the base
        name = "m"
        render_script = submit = cancel = status = queue = estimated_start = capabilities = lambda self, *a: None

    with Minimal() as m:
        assert m.close() is None
    with SlurmScheduler("s", tmp_path / "slurm.conf") as s:  # no subprocess is started by the context manager
        assert s.name == "s"


def test_script_helpers_live_in_base_and_slurm_uses_them():
    from lab.hpc.schedulers import local, slurm

    for name in ("render_setup", "time_dhms", "wait_status_exit_code"):
        fn = getattr(base, name)
        assert fn.__module__ == "lab.hpc.schedulers.base"
        assert getattr(slurm, name) is fn and getattr(local, name) is fn  # local still exports them
    assert base.time_dhms(90061) == "1-01:01:01"
    src = (ROOT / "lab/hpc/schedulers/slurm.py").read_text()
    assert "from lab.hpc.schedulers.local import" not in src
    spec = JobSpec(command="true", environment={"A": "x y"}, modules=["python/3.11"])
    assert base.render_setup("s", spec) == ["module load python/3.11", "export A='x y'"]


@pytest.mark.parametrize(("kw", "field"), [({"cpus": 0}, "cpus"), ({"cpus": "2"}, "cpus"), ({"cpus": True}, "cpus"),
                                           ({"poll_s": 0}, "poll_s"), ({"kill_grace_s": -1}, "kill_grace_s")])
def test_local_scheduler_arguments_are_typed(tmp_path, kw, field):
    with pytest.raises(ArgumentError) as info:
        LocalScheduler("x", workdir=tmp_path, **kw)
    assert info.value.field == field and info.value.where == "LocalScheduler"


def test_site_file_that_is_not_utf8_is_a_site_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_bytes(b'name = "\xff"\n')
    with pytest.raises(SiteError, match="not UTF-8 text") as info:  # UnicodeDecodeError (a ValueError) before
        load_site(path)
    assert info.value.path == path


# --------------------------------------------------------------------------- transfer package


def test_transfer_is_a_package_with_every_public_name():
    import lab.hpc.transfer as transfer
    from lab.hpc.transfer import base as tbase, globus, local

    assert Path(transfer.__file__).name == "__init__.py"
    assert transfer.LocalTransfer is local.LocalTransfer and transfer.GlobusTransfer is globus.GlobusTransfer
    assert transfer.TransferBackend is tbase.TransferBackend and transfer.sha256_file is local.sha256_file
    for name in transfer.__all__:
        assert hasattr(transfer, name), name


@pytest.mark.parametrize(("call", "where", "field"), [
    (lambda t: t.wait("x", timeout_s=-1), "LocalTransfer.wait", "timeout_s"),
    (lambda t: t.wait("x", poll_s=float("nan")), "LocalTransfer.wait", "poll_s"),
    (lambda t: t.estimate_s(-5), "LocalTransfer.estimate_s", "n_bytes"),
    (lambda t: t.estimate_s("many"), "LocalTransfer.estimate_s", "n_bytes"),  # a TypeError from '<' before
])
def test_transfer_argument_errors_name_the_argument(call, where, field):
    from lab.hpc.transfer import LocalTransfer

    with LocalTransfer() as t:
        with pytest.raises(ArgumentError) as info:
            call(t)
    assert (info.value.where, info.value.field) == (where, field) and isinstance(info.value, ValueError)


@pytest.mark.parametrize(("kw", "field"), [({"bandwidth_bytes_per_s": 0}, "bandwidth_bytes_per_s"), ({"chunk_size": 0}, "chunk_size"),
                                           ({"retries": -1}, "retries"), ({"max_workers": 0}, "max_workers"), ({"latency_s": -1}, "latency_s")])
def test_local_transfer_constructor_names_the_bad_argument(kw, field):
    from lab.hpc.transfer import LocalTransfer

    with pytest.raises(ArgumentError) as info:
        LocalTransfer(**kw)
    assert info.value.field == field  # one message for all five before, naming none


def test_globus_transfer_bandwidth_is_checked():
    from lab.hpc.transfer import GlobusTransfer

    with pytest.raises(ArgumentError, match="bandwidth_bytes_per_s=-1"):
        GlobusTransfer(object(), bandwidth_bytes_per_s=-1)
