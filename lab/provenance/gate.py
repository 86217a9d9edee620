"""The risk-sensitive action gate (MAP-Graph, step 4): is this evidence enough for this action?

An action's **risk class** says how irreversible it is; each class needs evidence that is
readable by the acting agent, trusted enough (path trust >= ``min_trust``), fresh enough
(age <= ``max_age_s``) and independent enough (``min_independent`` supporters with pairwise
disjoint source ancestries). The gate answers:

``allow``    the evidence meets the class's rule;
``verify``   it would, but some of it is stale: re-verify before acting;
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
from lab.provenance.trust import _best_sets, path_trusts, source_ancestry

__all__ = ["Risk", "EvidenceRule", "DEFAULT_RULES", "Decision", "GateDecision", "ActionGate"]

_DAY = 86400.0


class Risk(str, Enum):
    LOW = "low"  # read-only or trivially undone
    MEDIUM = "medium"  # undoable at a cost (change a seat, add a bag)
    HIGH = "high"  # costly to undo (book, change flights, refund to a card)
    CRITICAL = "critical"  # irreversible (cancel a non-refundable booking, send money)


class EvidenceRule(BaseModel):
    min_trust: float = Field(ge=0, le=1)
    min_independent: int = Field(ge=0)
    max_age_s: float | None = Field(None, gt=0)


#: Every class needs evidence at least as likely right as wrong (path trust >= 0.5) and written
#: within the last week; the costlier to undo, the more trust and independent support, and the
#: fresher. Chosen on the validation split of :mod:`lab.provenance.tasks` (seed 1): the earlier
#: low-risk rule (trust >= 0.3, no age limit; medium: 30 days) allowed 59 of 498 attack tasks
#: there (stale records, unvetted summaries); these allow none, at 100% clean accuracy.
DEFAULT_RULES: dict[Risk, EvidenceRule] = {
    Risk.LOW: EvidenceRule(min_trust=0.5, min_independent=1, max_age_s=7 * _DAY),
    Risk.MEDIUM: EvidenceRule(min_trust=0.5, min_independent=1, max_age_s=7 * _DAY),
    Risk.HIGH: EvidenceRule(min_trust=0.7, min_independent=2, max_age_s=7 * _DAY),
    Risk.CRITICAL: EvidenceRule(min_trust=0.9, min_independent=2, max_age_s=1 * _DAY),
}


class Decision(str, Enum):
    ALLOW = "allow"
    VERIFY = "verify"
    CONFIRM = "confirm"
    BLOCK = "block"


class GateDecision(BaseModel):
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
    rules : mapping of Risk to EvidenceRule, optional (default :data:`DEFAULT_RULES`)
    """

    def __init__(self, graph: ProvenanceGraph, policy: AccessPolicy | None = None, rules: Mapping[Risk, EvidenceRule] | None = None):
        self.graph = graph
        self.policy = policy or AccessPolicy(graph)
        self.rules = dict(rules or DEFAULT_RULES)

    def decide(self, agent: str, risk: Risk | str, evidence: Iterable[str], *, now: float | None = None) -> GateDecision:
        """The gate's answer for ``agent`` taking an action of class ``risk`` on ``evidence`` (record ids).

        ``now``: epoch seconds for freshness (default the clock). Raises
        :class:`~lab.provenance.errors.UnknownNodeError` for an unknown agent or record.
        """
        risk = Risk(risk)
        rule = self.rules[risk]
        now = time.time() if now is None else now
        ids = list(dict.fromkeys(evidence))
        eligible, excluded = self.policy.eligible(agent, ids)
        excluded = dict(excluded)
        trust = path_trusts(self.graph, eligible) if eligible else {}
        fresh, stale = [], []
        for i in eligible:
            node = self.graph.node(i)
            if not node.valid:
                excluded[i] = "invalidated (superseded)"
            elif trust[i] < rule.min_trust:
                excluded[i] = f"path trust {trust[i]:.2f} < {rule.min_trust:.2f} required for {risk.value} risk"
            elif rule.max_age_s is not None and now - node.time > rule.max_age_s:
                excluded[i] = f"stale: {now - node.time:.0f} s old > {rule.max_age_s:.0f} s allowed for {risk.value} risk"
                stale.append(i)
            else:
                fresh.append(i)
        used = self._independent(fresh, trust)
        reasons = []
        if len(used) >= rule.min_independent:
            decision = Decision.ALLOW
            reasons.append(f"{len(used)} independent trusted, fresh record(s) >= {rule.min_independent} required")
        elif len(self._independent(fresh + stale, trust)) >= rule.min_independent:
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
        return GateDecision(decision=decision, risk=risk, rule=rule, used=used, excluded=excluded, independent=len(used), reasons=reasons)

    def _independent(self, ids: list[str], trust: dict[str, float]) -> list[str]:
        if not ids:
            return []
        anc = {i: source_ancestry(self.graph, i) or frozenset({i}) for i in ids}
        return _best_sets(ids, anc, lambda s: (len(s), sum(trust[i] for i in s)))
