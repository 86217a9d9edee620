"""The risk-sensitive action gate (MAP-Graph, step 4): is this evidence enough for this action?

An action's **risk class** says how irreversible it is; each class needs evidence that is
readable by the acting agent (:meth:`AccessPolicy.filter`), standing (not invalidated, not left
without support: :func:`lab.provenance.lineage.standing`), trusted enough (path trust >= ``min_trust``),
grounded (a source in its lineage: an agent's bare claim is no evidence), fresh enough (age <=
``max_age_s``, not past its ``attributes["valid_until"]``, not marked for re-derivation) and
independent enough (``min_independent`` records with pairwise disjoint source ancestries). The gate
answers:

``allow``    the evidence meets the class's rule;
``verify``   it would, but some of it is stale (too old, past its validity, or derived from an
             invalidated record and awaiting re-derivation): re-verify before acting;
``confirm``  low- or medium-risk action with too little evidence: ask the user;
``block``    anything else, and any action whose evidence leans on a revoked or unreadable record
             while the rest is insufficient.

Each :class:`GateDecision` lists the records used and every excluded one with its reason.
The class rules are this lab's (MAP-Graph does not publish its thresholds); they are data, not code.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from enum import Enum

from pydantic import BaseModel, Field

from lab.provenance.access import AccessPolicy
from lab.provenance.graph import ProvenanceGraph
from lab.provenance.lineage import standing
from lab.provenance.trust import _best_sets, source_ancestry

__all__ = ["Risk", "EvidenceRule", "DEFAULT_RULES", "Decision", "GateDecision", "ActionGate"]

_DAY = 86400.0


class Risk(str, Enum):
    """How costly an action is to undo, which sets the evidence it needs (:data:`DEFAULT_RULES`).

    ``LOW``: read-only or trivially undone; ``MEDIUM``: undoable at a cost (change a seat, add a bag);
    ``HIGH``: costly to undo (book, change flights, refund to a card); ``CRITICAL``: irreversible (cancel a
    non-refundable booking, send money).
    """

    LOW = "low"  # read-only or trivially undone
    MEDIUM = "medium"  # undoable at a cost (change a seat, add a bag)
    HIGH = "high"  # costly to undo (book, change flights, refund to a card)
    CRITICAL = "critical"  # irreversible (cancel a non-refundable booking, send money)


class EvidenceRule(BaseModel):
    """What one risk class asks of the evidence.

    Parameters
    ----------
    min_trust : float
        In [0, 1]: the least path trust a record needs to count.
    min_independent : int
        How many records with pairwise disjoint source ancestries the action needs (>= 0).
    max_age_s : float, optional
        The oldest a record may be, in seconds before ``now`` (> 0; ``None``: no age limit). A record past
        its ``attributes["valid_until"]`` is stale whatever this says.
    """

    min_trust: float = Field(ge=0, le=1)
    min_independent: int = Field(ge=0)
    max_age_s: float | None = Field(None, gt=0)


#: Every class needs evidence at least as likely right as wrong (path trust >= 0.5) and written
#: within the last week; the costlier to undo, the more trust and independent support, and the
#: fresher. These are hand-set, conservative defaults (MAP-Graph publishes no thresholds), not fitted:
#: ``benchmarks.mapgraph`` tunes its own rules per generator seed on a shifted validation split and passes
#: them as ``ActionGate(rules=...)``; what it chose (``methods.mapgraph.tuning`` in
#: ``benchmarks/results/mapgraph.json``) is trust 0.65-0.7 for low risk, 0.6-0.7 medium, 0.4-0.6 high
#: and critical, with age limits of 1.5 to 10 days.
DEFAULT_RULES: dict[Risk, EvidenceRule] = {
    Risk.LOW: EvidenceRule(min_trust=0.5, min_independent=1, max_age_s=7 * _DAY),
    Risk.MEDIUM: EvidenceRule(min_trust=0.5, min_independent=1, max_age_s=7 * _DAY),
    Risk.HIGH: EvidenceRule(min_trust=0.7, min_independent=2, max_age_s=7 * _DAY),
    Risk.CRITICAL: EvidenceRule(min_trust=0.9, min_independent=2, max_age_s=1 * _DAY),
}


class Decision(str, Enum):
    """The gate's answer: ``ALLOW`` (act), ``VERIFY`` (re-verify stale evidence first), ``CONFIRM`` (ask the
    user: a low- or medium-risk action on too little evidence), ``BLOCK`` (refuse)."""

    ALLOW = "allow"
    VERIFY = "verify"
    CONFIRM = "confirm"
    BLOCK = "block"


class GateDecision(BaseModel):
    """One decision of :meth:`ActionGate.decide`, with what it rests on (the receipt MAP-Graph keeps for audit).

    Parameters
    ----------
    decision : Decision
    risk : Risk
    rule : EvidenceRule
        The rule the risk class asked for.
    used : list of str
        The independent evidence the decision rests on.
    excluded : dict of str to str
        Each cited record that was not usable, with why (unreadable, invalidated, unsupported, untrusted,
        ungrounded, stale, past its validity, awaiting re-derivation).
    independent : int
        ``len(used)``.
    reasons : list of str
        Why this decision, first the deciding count, then notes (revoked evidence, records past their validity).
    """

    decision: Decision
    risk: Risk
    rule: EvidenceRule
    used: list[str] = Field(description="the independent evidence the decision rests on")
    excluded: dict[str, str] = Field(description="evidence not usable, with why")
    independent: int
    reasons: list[str]


class ActionGate:
    """Decide whether an agent may take an action given the evidence it cites.

    Parameters
    ----------
    graph : ProvenanceGraph
    policy : AccessPolicy, optional
        Default: a policy over ``graph``.
    rules : mapping of Risk to EvidenceRule, optional
        Default :data:`DEFAULT_RULES`.
    """

    def __init__(self, graph: ProvenanceGraph, policy: AccessPolicy | None = None, rules: Mapping[Risk, EvidenceRule] | None = None):
        self.graph = graph
        self.policy = policy or AccessPolicy(graph)
        self.rules = dict(rules or DEFAULT_RULES)

    def decide(self, agent: str, risk: Risk | str, evidence: Iterable[str], *, now: float | None = None) -> GateDecision:
        """The gate's answer for ``agent`` taking an action of class ``risk`` on ``evidence``.

        Parameters
        ----------
        agent : str
            The acting principal (an agent node id).
        risk : Risk or str
        evidence : iterable of str
            The record ids the action cites.
        now : float, optional
            Epoch seconds for freshness and validity (default: the clock).

        Returns
        -------
        GateDecision

        Raises
        ------
        UnknownNodeError
            An unknown agent or record.
        """
        risk = Risk(risk)
        rule = self.rules[risk]
        now = time.time() if now is None else now
        ids = list(dict.fromkeys(evidence))
        rows = self.graph.indexed(ids)
        eligible, excluded = self.policy.filter(agent, rows)
        excluded = dict(excluded)
        fresh, stale, expired = [], [], []
        ancestry: dict[str, frozenset[str]] = {}
        for i in eligible:
            node, inh = rows[i]
            trust = inh.path_trust
            until = node.attributes.get("valid_until")
            why = standing(i, node, inh)
            if why is not None:
                excluded[i] = why
            elif trust < rule.min_trust:
                excluded[i] = f"path trust {trust:.2f} < {rule.min_trust:.2f} required for {risk.value} risk"
            elif not (ancestry.setdefault(i, source_ancestry(self.graph, i))):
                excluded[i] = "no evidence: no source in its lineage"
            elif inh.rederive:
                excluded[i] = f"needs re-derivation: derived from invalidated {list(inh.rederive)}"
                stale.append(i)
            elif until is not None and now > until:
                excluded[i] = f"stale: past its validity (valid_until {until:.0f}, {now - until:.0f} s ago) for {risk.value} risk"
                stale.append(i)
                expired.append(i)
            elif rule.max_age_s is not None and now - node.time > rule.max_age_s:
                excluded[i] = f"stale: {now - node.time:.0f} s old > {rule.max_age_s:.0f} s allowed for {risk.value} risk"
                stale.append(i)
            else:
                fresh.append(i)
        trusts = {i: rows[i][1].path_trust for i in ancestry}
        used = self._independent(fresh, ancestry, trusts)
        reasons = []
        if len(used) >= rule.min_independent:
            decision = Decision.ALLOW
            reasons.append(f"{len(used)} independent trusted, fresh record(s) >= {rule.min_independent} required")
        elif len(self._independent(fresh + stale, ancestry, trusts)) >= rule.min_independent:
            decision = Decision.VERIFY
            reasons.append("enough independent evidence only if stale records count: re-verify them")
        elif risk in (Risk.LOW, Risk.MEDIUM):
            decision = Decision.CONFIRM
            reasons.append(f"{len(used)} of {rule.min_independent} independent record(s) for a {risk.value}-risk action: ask the user")
        else:
            decision = Decision.BLOCK
            reasons.append(f"{len(used)} of {rule.min_independent} independent trusted record(s) for a {risk.value}-risk action")
        revoked = [i for i, why in excluded.items() if why.startswith("revoked")]
        if revoked:
            reasons.append(f"evidence excluded as revoked: {sorted(revoked)}")
        if expired:
            reasons.append(f"evidence past their validity: {sorted(expired)}")
        return GateDecision(decision=decision, risk=risk, rule=rule, used=used, excluded=excluded, independent=len(used), reasons=reasons)

    @staticmethod
    def _independent(ids: list[str], ancestry: dict[str, frozenset[str]], trust: dict[str, float]) -> list[str]:
        if not ids:
            return []
        return _best_sets(ids, {i: ancestry[i] for i in ids}, lambda s: (len(s), sum(trust[i] for i in s)))
