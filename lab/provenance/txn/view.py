"""What the provenance explorer shows of a MemTX store: each record's lifecycle state and a cascade.

:func:`apply_lifecycle` adds to the explorer's elements (:func:`lab.provenance.view.explorer_elements` of a graph
the store was mirrored into, :meth:`MemTXStore.mirror`) one mark per inactive state and per repaired action
(:data:`LIFECYCLE_ENCODING`: a cytoscape style the front end applies and the legend entry that says what it
means), so a quarantined summary, a revoked belief and a superseded record are told apart in the drawing, not
only by the ``[state]`` their label starts with. :func:`lifecycle_elements` mirrors the store and returns those
elements with, per node, ``lifecycle`` (the state), ``memtx_type``, ``faded`` (quarantined, superseded,
revoked) and ``effect`` (a tool action's ``executed`` / ``compensated`` / ``leaked``); ``cascade`` lists a
:class:`~lab.provenance.txn.CascadeReport`'s steps when one is given.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from lab.provenance.graph import ProvenanceGraph
from lab.provenance.labels import key_arguments
from lab.provenance.txn.store import CascadeReport, MemTXStore
from lab.provenance.view import explorer_elements

__all__ = ["lifecycle_elements", "apply_lifecycle", "lifecycle_marks", "FADED", "LIFECYCLE_ENCODING"]

#: States the explorer draws faded.
FADED = frozenset({"quarantined", "superseded", "revoked"})

#: How a faded state is drawn: fill and border see-through, the label greyed on an opaque background (a
#: whole-node ``opacity`` would let the edges show through the label).
_FADE = {"background-opacity": 0.3, "border-opacity": 0.6, "text-opacity": 0.6, "text-background-opacity": 1}

#: Legend entries and cytoscape styles of the lifecycle marks (``lifecycle_<state>`` for the faded states,
#: ``effect_<status>`` for a repaired tool action). Each faded state has its own border colour, so the
#: legend tells quarantined (rebuildable) from revoked (terminal) and superseded.
LIFECYCLE_ENCODING: dict[str, dict[str, Any]] = {
    "lifecycle_quarantined": {"border": "dashed", "color": "#e69f00", "meaning": "faded, orange dashed: quarantined (inactive, to be rebuilt)",
                              "style": {**_FADE, "border-style": "dashed", "border-color": "#e69f00"}},
    "lifecycle_revoked": {"border": "dashed", "color": "#000000", "meaning": "faded, black dashed: revoked (terminal)",
                          "style": {**_FADE, "border-style": "dashed", "border-color": "#000000"}},
    "lifecycle_superseded": {"border": "dashed", "color": "#9467bd", "meaning": "faded, violet dashed: superseded by a newer value",
                             "style": {**_FADE, "border-style": "dashed", "border-color": "#9467bd"}},
    "effect_compensated": {"border": "double", "color": "#1f77b4", "meaning": "double blue border: action compensated by the cascade",
                           "style": {"border-style": "double", "border-width": 6, "border-color": "#1f77b4", "border-opacity": 1}},
    "effect_leaked": {"border": "double", "color": "#bb0000", "meaning": "double red border: LEAKED irreversible effect (logged)",
                      "style": {"border-style": "double", "border-width": 6, "border-color": "#bb0000", "border-opacity": 1}},
}


def lifecycle_marks(state: str, effect: str = "") -> list[str]:
    """The :data:`LIFECYCLE_ENCODING` keys a record in lifecycle ``state`` (a :class:`~lab.provenance.txn.State`
    value) with tool effect ``effect`` (``""``, ``executed``, ``compensated``, ``leaked``) carries."""
    out = [f"lifecycle_{state}"] if state in FADED else []
    if f"effect_{effect}" in LIFECYCLE_ENCODING:
        out.append(f"effect_{effect}")
    return out


def apply_lifecycle(elements: Mapping[str, Any], store: MemTXStore) -> dict[str, Any]:
    """A copy of explorer ``elements`` with each MemTX record's lifecycle fields and marks.

    Parameters
    ----------
    elements : mapping
        From :func:`lab.provenance.view.explorer_elements` of a graph ``store`` was mirrored into.
    store : MemTXStore

    Returns
    -------
    dict
        The elements; every node that is a record of ``store`` gets ``lifecycle`` (its state), ``faded``,
        ``effect`` and :func:`lifecycle_marks` appended to ``marks``; a tool action's ``label`` becomes its fate,
        the tool and its key arguments (:func:`lab.provenance.labels.key_arguments`), e.g.
        ``"[compensated] hold_seat\\nreservation=4WQ150"``; :data:`LIFECYCLE_ENCODING` is added to
        ``encoding["borders"]`` so the front end styles the marks and the legend lists those present.
    """
    els = copy.deepcopy(dict(elements))
    states = store.states()
    effects = store.effects()
    for node in els.get("nodes", []):
        d = node["data"]
        st = states.get(d["id"])
        if st is None:
            continue
        effect = effects.get(d["id"], {}).get("status", "")
        d["lifecycle"], d["faded"], d["effect"] = st.value, st.value in FADED, effect
        d["marks"] = list(d.get("marks", [])) + [m for m in lifecycle_marks(st.value, effect) if m not in d.get("marks", [])]
        if d["id"] in effects and d.get("text", "").startswith("["):  # an action: its fate, the tool, its key arguments
            fate = d["text"][: d["text"].index("]") + 1]
            args = key_arguments(effects[d["id"]]["args"]) if isinstance(effects[d["id"]]["args"], Mapping) else ""
            d["label"] = f"{fate} {effects[d['id']]['tool']}" + (f"\n{args}" if args else "")
    enc = els.setdefault("encoding", {})
    enc["borders"] = {**enc.get("borders", {}), **LIFECYCLE_ENCODING}
    return els


def lifecycle_elements(store: MemTXStore, graph: ProvenanceGraph, report: CascadeReport | None = None) -> dict[str, Any]:
    """Explorer elements of ``store`` (mirrored into ``graph`` first) with lifecycle fields and marks
    (:func:`apply_lifecycle`) and ``memtx_type``; see the module docstring."""
    store.mirror(graph)
    els = apply_lifecycle(explorer_elements(graph), store)
    for node in els["nodes"]:
        d = node["data"]
        if "lifecycle" in d:
            d["memtx_type"] = graph.node(d["id"]).attributes.get("memtx_type", "")
    els["cascade"] = report.as_dict() if report is not None else None
    return els
