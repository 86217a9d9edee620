"""lab.hpc.placement's policies: one pure function each over the SiteView protocol, ties by site name."""

from __future__ import annotations

import inspect
import itertools

import pytest

import benchmarks.placement_live as live
import benchmarks.placement_replay as replay
from lab.hpc import placement
from lab.hpc.placement import Candidate, PlacementError, SiteState, SiteView, choose


def views():
    return [
        SiteState("c", pending=3, free=0, predicted_completion=50.0),
        SiteState("a", pending=1, free=2, predicted_completion=90.0),
        SiteState("b", pending=1, free=8, predicted_completion=70.0),
        SiteState("d", pending=0, free=0, predicted_completion=None, eligible=False),
    ]


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_choices_do_not_depend_on_the_order_sites_are_listed(order):
    v = [views()[i] for i in order]
    assert choose("least_pending", v).site == "b"  # a and b pend 1; b has more free; d is not eligible
    assert choose("idle_first", v, processors=4).site == "b"  # only b has 4 free
    assert choose("idle_first", v, processors=2).site == "b"  # a and b fit: least pending, then more free
    assert choose("idle_first", v, processors=9).site == "b"  # nobody fits: least pending of all
    assert choose("earliest_completion", v).site == "c"
    assert choose("fixed_site", v, home="a").site == "a"


def test_ties_are_broken_by_site_name():
    tied = [SiteState("z", 2, 4, 10.0), SiteState("m", 2, 4, 10.0), SiteState("k", 2, 4, 10.0)]
    for policy in ("least_pending", "idle_first", "earliest_completion"):
        assert choose(policy, tied, processors=1).site == "k"
        assert choose(policy, tied[::-1], processors=1).site == "k"


def test_refusals_are_typed_and_name_the_problem():
    with pytest.raises(PlacementError, match="unknown placement policy 'fastest'"):
        choose("fastest", views())
    with pytest.raises(PlacementError, match="fixed_site needs home"):
        choose("fixed_site", views())
    with pytest.raises(PlacementError, match="home site 'd' cannot take the job"):
        choose("fixed_site", views(), home="d")
    with pytest.raises(PlacementError, match="no site named 'x'"):
        choose("fixed_site", views(), home="x")
    with pytest.raises(PlacementError, match="no eligible site"):
        choose("least_pending", [SiteState("d", 0, 0, eligible=False)])


def test_live_candidates_are_site_views():
    c = Candidate(site="alpha", eligible=True, pending=2, idle_cpus=3, predicted_completion=5.0)
    assert isinstance(c, SiteView) and isinstance(SiteState("a", 0, 0), SiteView)
    assert c.free == 3 and Candidate(site="b", eligible=False).free == 0
    assert choose("idle_first", [c, Candidate(site="beta", eligible=True, pending=0, idle_cpus=0)], processors=2).site == "alpha"


def test_benchmarks_have_no_policy_of_their_own():
    # both benchmarks decide through lab.hpc.placement.choose (the policies that ship)
    for module in (replay, live):
        src = inspect.getsource(module)
        assert "placement.choose(" in src or "choose(policy, ec.candidates" in src
        assert "def _least_pending" not in src and "idle[0]" not in src
    assert replay.placement is placement
