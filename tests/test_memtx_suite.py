"""The MemTX corruption suite at CI size (one seed of the main suite): MemTX has no harm and lets >= 0.93 of the
controls act, the write-immediately floor is harmed in every family, and each single-feature ablation is harmed
on the family it guards (the benchmark runs five seeds and the hardened suite)."""

from __future__ import annotations

import random

import pytest

from lab.provenance.txn.suite import FAMILIES, GUARDS, METHODS, hardened_suite, load_entities, main_suite, run_case


@pytest.fixture(scope="module")
def cases():
    ents = load_entities(random.Random(0), 60)
    return main_suite(ents, 0), hardened_suite(ents, 0)


def _harm_by_family(results):
    return {f: sum(r.harm for r in results if r.trap and f in r.families) for f in FAMILIES}


def test_suite_sizes(cases):
    main, hard = cases
    assert len(main) == 90 and sum(c.trap for c in main) == 60
    assert len(hard) == 56 and sum(c.trap for c in hard) == 40 and all(len(c.families) == 2 for c in hard)


def test_memtx_no_harm_and_controls_allowed(cases):
    main, hard = cases
    rs = [run_case(c, METHODS["memtx"]) for c in main + hard]
    assert not any(r.harm for r in rs), [r.case for r in rs if r.harm]
    ctrl = [r for r in rs if not r.trap]
    assert sum(bool(r.allowed) for r in ctrl) / len(ctrl) >= 0.93
    assert all(r.aborted for r in rs if r.aborted is not None)
    assert all(a == b for a, b in (r.repaired for r in rs if r.repaired))
    assert all(r.enforced for r in rs if r.enforced is not None)


def test_floor_and_ablations_are_harmed_where_expected(cases):
    main, _ = cases
    floor = _harm_by_family([run_case(c, METHODS["write_immediately"]) for c in main])
    assert all(v == 10 for v in floor.values()), floor
    for feature, family in GUARDS.items():
        harmed = _harm_by_family([run_case(c, METHODS[f"memtx-no-{feature}"]) for c in main if family in c.families])
        assert harmed[family] > 0, (feature, family)
