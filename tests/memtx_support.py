"""Shared helpers of the MemTX tests: a record factory and a session PostgreSQL server (Debian's postgresql,
started on 127.0.0.1 in a temporary folder as the ``postgres`` user; :mod:`lab.provenance.txn.pgserver`)."""

from __future__ import annotations

import itertools

import pytest

from lab.provenance.txn import MemTXStore
from lab.provenance.txn.pgserver import LocalPostgres

_db = itertools.count()


def rec(i, ent="res:1", attr="status", val="ok", src="crm", auth=0.8, conf=0.9, typ="belief", parents=(), scope="shared", owner="a", readers=(), **kw):
    """A record's fields (a belief in the shared slot ``res:1.status`` unless told otherwise)."""
    return dict(id=i, type=typ, entity=ent, attribute=attr, value=val, evidence=dict(source=src, authority=auth, confidence=conf),
                permission=dict(owner=owner, scope=scope, readers=frozenset(readers)), derived_from=tuple(parents), **kw)


@pytest.fixture(scope="session")
def pg_server():
    server = LocalPostgres()
    try:
        server.start()
    except Exception as exc:  # the Makefile's postgresql target installs it; say how when it is missing
        pytest.fail(f"cannot start a local PostgreSQL (make postgresql): {exc}")
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend_where(request, tmp_path):
    """Where a fresh store lives: an SQLite file, or a fresh database on the session's PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "memtx.db")
    server = request.getfixturevalue("pg_server")
    return server.fresh_database(f"t{next(_db)}")


@pytest.fixture
def store(backend_where):
    s = MemTXStore(backend_where)
    yield s
    s.close()
