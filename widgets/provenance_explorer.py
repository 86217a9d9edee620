"""Provenance explorer: an interactive view of an agent run's execution graph.

A thin anywidget over :mod:`lab.provenance.view`: Python computes the elements (types, path
trust, eligibility for an agent with the reason, gate decisions), the lineage neighbourhood of
the selected node and its details, and which nodes the filters and the time limit leave visible
(``visible``, by :func:`lab.provenance.view.visible_ids`); the front end (``provenance_explorer.js``,
bundled from ``widgets/js/provenance_explorer``; rebuild with ``npm ci && npm run build`` there) draws
them with cytoscape, lets the user click a node (``selected``), tick filters (``filters``), scrub
time (``time_max``) and search (``query``), shows exactly the ``visible`` nodes and styles whatever
``highlight`` says. Beside the graph it draws the legend, the counter, the search hits and the run's
timeline (a span tree with timings, :func:`lab.provenance.timeline.timeline`) that Python computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anywidget
import traitlets as t

from lab.provenance.access import AccessPolicy
from lab.provenance.errors import UnknownNodeError
from lab.provenance.gate import GateDecision
from lab.provenance.graph import ProvenanceGraph
from lab.provenance.timeline import format_time, time_axis, timeline
from lab.provenance.view import counter, describe, explorer_elements, legend, neighbourhood, search, time_label, visible_ids

__all__ = ["ProvenanceExplorer"]

_BUNDLE = Path(__file__).with_name("provenance_explorer.js")


class ProvenanceExplorer(anywidget.AnyWidget):
    """Explore a :class:`~lab.provenance.graph.ProvenanceGraph` (one run of it, if ``run`` is given).

    Parameters
    ----------
    graph : ProvenanceGraph
    run : str, optional
        Show only this run's nodes.
    agent : str, optional
        Grey out the records this agent may not read (with the reason).
    policy : AccessPolicy, optional
    decisions : mapping of action id to GateDecision, optional
        Gate decisions shown on the action nodes.
    memtx : lab.provenance.txn.MemTXStore, optional
        Mirrored into ``graph`` on every :meth:`refresh`: labels start with each record's lifecycle state (an
        action's ``compensated`` / ``LEAKED irreversible`` once a cascade repaired it); quarantined, superseded
        and revoked records are drawn faded, each with its own border colour, and a compensated or leaked action
        with a double border (:func:`lab.provenance.txn.view.apply_lifecycle`; the legend lists them).
    repair : mapping, optional
        A repair's marks (:func:`lab.provenance.repair.view.repair_overlay`): deactivated records faded,
        replayed steps with a purple border, the support path that kept a record in green.

    Synced traits: ``elements`` (from :func:`lab.provenance.view.explorer_elements`), ``selected``
    (a node id; a click in the browser sets it), ``filters`` (``types``/``agents``/``scopes``
    lists of the values shown), ``time_max`` (nodes later than it are hidden; ``None``: none),
    ``visible`` (the node ids ``filters`` and ``time_max`` leave shown, recomputed here whenever one of
    them or ``elements`` changes; the browser only shows these), ``highlight`` (``ancestors``/``descendants``
    of ``selected``) and ``detail`` (its description). Computed here from those and drawn as they are:
    ``legend`` (:func:`~lab.provenance.view.legend`: the marks actually drawn, with counts), ``counter``
    (:func:`~lab.provenance.view.counter`), ``time_label`` (the slider's reading with its unit,
    :func:`~lab.provenance.view.time_label`), ``hits`` (:func:`~lab.provenance.view.search` of ``query``,
    which the search box sets) and ``timeline`` (:func:`lab.provenance.timeline.timeline` of the nodes shown
    in ``elements``; its rows follow ``visible`` too).
    """

    _esm = _BUNDLE
    elements = t.Dict().tag(sync=True)
    selected = t.Unicode("").tag(sync=True)
    filters = t.Dict().tag(sync=True)
    time_max = t.Float(None, allow_none=True).tag(sync=True)
    visible = t.List(t.Unicode()).tag(sync=True)
    highlight = t.Dict().tag(sync=True)
    detail = t.Dict().tag(sync=True)
    legend = t.List(t.Dict()).tag(sync=True)
    counter = t.Dict().tag(sync=True)
    time_label = t.Unicode("").tag(sync=True)
    query = t.Unicode("").tag(sync=True)
    hits = t.Dict().tag(sync=True)
    timeline = t.Dict().tag(sync=True)

    def __init__(
        self,
        graph: ProvenanceGraph,
        *,
        run: str | None = None,
        agent: str | None = None,
        policy: AccessPolicy | None = None,
        decisions: Mapping[str, GateDecision] | None = None,
        repair: Mapping[str, Any] | None = None,
        memtx: Any = None,
        **kwargs: Any,
    ):
        self.memtx = memtx  # a lab.provenance.txn.MemTXStore, mirrored into graph on every refresh
        self.graph, self.run, self.agent = graph, run, agent
        self.repair = dict(repair) if repair else None  # lab.provenance.repair.view.repair_overlay: marks drawn over the run
        self.policy = policy or (AccessPolicy(graph) if agent is not None else None)
        self.decisions = dict(decisions or {})
        super().__init__(**kwargs)
        self.refresh()

    def refresh(self) -> None:
        """Recompute the elements from the graph's current state (filters reset to show everything)."""
        if self.memtx is not None:
            self.memtx.mirror(self.graph)
        els = explorer_elements(self.graph, run=self.run, agent=self.agent, policy=self.policy, decisions=self.decisions)
        if self.memtx is not None:
            from lab.provenance.txn.view import apply_lifecycle

            els = apply_lifecycle(els, self.memtx)
        if self.repair:
            from lab.provenance.repair.view import apply_repair

            els = apply_repair(els, self.repair)
        rows = timeline(self.graph, [n["data"]["id"] for n in els["nodes"]])
        with self.hold_sync():  # one message: the front end redraws with the new elements' visible ids
            self.timeline = rows
            self.elements = els
            self.filters = {"types": list(els["types"]), "agents": list(els["agents"]), "scopes": list(els["scopes"])}
            self._update_selection()
            self._on_query(None)

    @t.observe("elements", "filters", "time_max")
    def _on_visibility_inputs(self, change) -> None:
        with self.hold_sync():
            self.visible = visible_ids(self.elements, self.filters, self.time_max)
            self.legend = legend(self.elements, self.visible)
            self.counter = counter(self.elements, self.visible)
            self.time_label = time_label(self.elements, self.time_max)

    @t.observe("query")
    def _on_query(self, change) -> None:
        self.hits = search(self.elements, self.query)

    @t.observe("selected")
    def _on_selected(self, change) -> None:
        self._update_selection()

    def _update_selection(self) -> None:
        node_id = self.selected
        if not node_id:
            self.highlight, self.detail = {"ancestors": [], "descendants": []}, {}
            return
        try:
            self.highlight = neighbourhood(self.graph, node_id)
            detail = describe(self.graph, node_id, agent=self.agent, policy=self.policy, decisions=self.decisions)
            self.detail = {**detail, "time_label": format_time(self.elements.get("time_axis") or time_axis([]), detail["time"])}
        except UnknownNodeError as exc:
            self.highlight, self.detail = {"ancestors": [], "descendants": []}, {"id": node_id, "error": str(exc)}
