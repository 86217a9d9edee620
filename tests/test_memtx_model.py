"""The MemTX model checker (lab.provenance.txn.model) at a CI-sized bound: 0 violations of I1, I2, G3 for MemTX,
the deliberately broken variants caught, canonicalisation sound, and model traces replayed on both backends."""

from __future__ import annotations

import pytest

from lab.provenance.errors import MemTXError
from lab.provenance.txn import Features, MemTXStore
from lab.provenance.txn.model import EXT, LOW, canonical, enumerate_states, initial, replay, step, traces
from tests.memtx_support import backend_where  # noqa: F401  (fixtures; pg_server comes from conftest)


def test_memtx_has_no_violation_at_a_small_bound():
    r = enumerate_states(records=4, txs=3, depth=5)
    assert r.violations == 0, r.examples
    # the counts are a regression check of the model (the benchmark runs the full bound)
    assert (r.states, r.transitions) == (14427, 18522)
    assert r.per_depth[:4] == [1, 2, 7, 53]


@pytest.mark.parametrize("variant, invariant", [("gate_off", "I1"), ("cascade_skips_summaries", "I2")])
def test_broken_variants_are_caught(variant, invariant):
    r = enumerate_states(records=4, txs=3, depth=5, variant=variant, keep_traces=True)
    assert r.violations > 0
    message, trace = r.examples[0]
    assert message.startswith(invariant), message
    assert 1 <= len(trace) <= 5


def test_canonicalisation_merges_symmetric_states():
    s = initial(4, 3)
    a = step(step(s, ("begin", 0, LOW))[0], ("stage", 0, 0, None, 0, 1))[0]
    b = step(step(s, ("begin", 2, LOW))[0], ("stage", 2, 0, None, 1, 1))[0]  # another transaction, the other slot
    assert a != b and canonical(a)[1] == canonical(b)[1]
    c = step(step(s, ("begin", 0, EXT))[0], ("stage", 0, 0, None, 0, 1))[0]  # another tier is not symmetric
    assert canonical(a)[1] != canonical(c)[1]


def test_model_traces_replay_identically_on_the_store(backend_where):
    n = 150 if backend_where.endswith(".db") else 40
    for i, trace in enumerate(traces(n, depth=12, seed=7)):
        where = backend_where if not backend_where.endswith(".db") else ":memory:"
        bad = replay(trace, lambda: _fresh(where, i))
        assert not bad, (trace, bad[:3])


def _fresh(where, i):
    if where == ":memory:":
        return MemTXStore(":memory:")
    s = MemTXStore(where)  # one PostgreSQL database: records get fresh ids per trace, so wipe it first
    with s.db.write():
        for t in ("records", "parents", "versions", "heads", "pending", "txs", "audit", "effects"):
            s.db.x(f"DELETE FROM {t}")
    return s


def test_replay_catches_a_broken_store():
    trs = traces(400, depth=12, seed=3)
    broken = sum(bool(replay(t, lambda: MemTXStore(":memory:", features=Features().without("cascade_summaries")))) for t in trs)
    assert broken > 0


def test_packed_states_round_trip_and_the_bound_is_checked():
    from lab.provenance.txn.model import _decode, _key

    s = initial(4, 3)
    for a in [("begin", 1, EXT), ("stage", 1, 0, None, 1, 1), ("stage", 1, 1, 0, 0, 1), ("call", 1, 2, 0), ("begin", 0, LOW)]:
        s = step(s, a)[0]
    c, k = canonical(s)
    assert _decode(k, 4, 3) == c and canonical(c) == (c, k)  # the frontier's ints decode to the canonical state
    assert _key(s)[0] == k and sorted(c[1]) == sorted(s[1])
    with pytest.raises(MemTXError, match="records=5"):
        enumerate_states(records=5, txs=3, depth=1)
