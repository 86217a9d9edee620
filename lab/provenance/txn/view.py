"""What the provenance explorer shows of a MemTX store: each record's lifecycle state and a cascade.

:func:`lifecycle_elements` mirrors the store into a :class:`~lab.provenance.graph.ProvenanceGraph`
(:meth:`MemTXStore.mirror`) and returns the explorer's elements (:func:`lab.provenance.view.explorer_elements`)
with, per node, ``lifecycle`` (the state), ``memtx_type``, ``faded`` (quarantined, superseded, revoked) and
``effect`` (a tool action's ``executed`` / ``compensated`` / ``leaked``); ``cascade`` lists a
:class:`~lab.provenance.txn.CascadeReport`'s steps when one is given.
"""

from __future__ import annotations

from typing import Any

from lab.provenance.graph import ProvenanceGraph
from lab.provenance.txn.store import CascadeReport, MemTXStore
from lab.provenance.view import explorer_elements

__all__ = ["lifecycle_elements", "FADED"]

#: States the explorer draws faded.
FADED = frozenset({"quarantined", "superseded", "revoked"})


def lifecycle_elements(store: MemTXStore, graph: ProvenanceGraph, report: CascadeReport | None = None) -> dict[str, Any]:
    """Explorer elements of ``store`` (mirrored into ``graph`` first) with lifecycle fields; see the module docstring."""
    store.mirror(graph)
    els = explorer_elements(graph)
    effects = store.effects()
    states = store.states()
    for node in els["nodes"]:
        d = node["data"]
        st = states.get(d["id"])
        if st is None:
            continue
        d["lifecycle"] = st.value
        d["memtx_type"] = graph.node(d["id"]).attributes.get("memtx_type", "")
        d["faded"] = st.value in FADED
        d["effect"] = effects.get(d["id"], {}).get("status", "")
    els["cascade"] = report.as_dict() if report is not None else None
    return els
