"""Hypothesis stateful test (RuleBasedStateMachine) over the real MemTX store on both backends: random
interleavings of begin / stage / tool call / commit / abort / request_revocation / retract, with I1, I2 and G3
checked against the store's own state after every step (small bound in CI); the same machine must fail on the
deliberately broken stores (gate off; cascade that skips summaries)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from lab.provenance.txn import ACTIVE, Features, MemTXStore, State, Tier
from tests.memtx_support import backend_where  # noqa: F401  (fixtures; pg_server comes from conftest)

LIVE = (State.COMMITTED, State.ACTION_SAFE)
TABLES = ("records", "parents", "versions", "heads", "pending", "txs", "audit", "effects")


def machine_for(where: str, features: Features):
    class MemTXMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.store = MemTXStore(where, features=features)
            if not where.endswith(".db") and where != ":memory:":
                with self.store.db.write():
                    for t in TABLES:
                        self.store.db.x(f"DELETE FROM {t}")
            self.store.register_tool("refund", irreversible=True, run=lambda a: None)
            self.store.register_tool("hold", irreversible=False, run=lambda a: None, compensate=lambda a: None)
            self.txs = []
            self.ids = []
            self.n = 0

        def teardown(self):
            self.store.close()

        @rule(tier=st.sampled_from([Tier.LOW, Tier.EXTERNAL_ACTION]))
        @precondition(lambda self: len(self.txs) < 3)
        def begin(self, tier):
            self.txs.append(self.store.begin(f"agent{len(self.txs)}", tier=tier))

        @rule(data=st.data(), typ=st.sampled_from(["belief", "summary"]), slot=st.integers(0, 1), ok=st.booleans())
        @precondition(lambda self: self.txs and self.n < 6)
        def stage(self, data, typ, slot, ok):
            tx = data.draw(st.sampled_from(self.txs))
            parents = ()
            if self.ids and (typ == "summary" or data.draw(st.booleans())):
                parents = (data.draw(st.sampled_from(self.ids)),)
            elif typ == "summary":
                return
            rid = f"r{self.n}"
            self.n += 1
            tx.stage(dict(id=rid, type=typ, entity=f"slot{slot}", attribute="v", value=rid,
                          evidence=dict(source="s", authority=0.5, confidence=0.9 if ok else 0.3),
                          permission=dict(owner="agents", scope="shared"), derived_from=parents))
            self.ids.append(rid)

        @rule(data=st.data(), tool=st.sampled_from(["refund", "hold"]))
        @precondition(lambda self: self.txs and self.ids)
        def call(self, data, tool):
            tx = data.draw(st.sampled_from(self.txs))
            premise = data.draw(st.sampled_from(self.ids))
            before = self.store.states()
            pending = self.store.pending()
            call = tx.call_tool(tool, {"n": self.n}, uses=[premise])
            if call.decision.allowed and tool == "refund":
                # I1, from the store's state before the call (not from the gate's code)
                entity = self.store.record(premise).entity
                tentative = [r for r, s in before.items() if s == State.TENTATIVE and self.store.record(r).entity == entity]
                assert not tentative, f"I1: refund ran while {tentative} were tentative"
                assert before[premise] in LIVE, f"I1: refund on a {before[premise].value} premise"
                anc = self._ancestors(premise) | {premise}
                assert not anc & pending, "I1: refund on a premise pending revocation"
                if tx.tier == Tier.EXTERNAL_ACTION:
                    assert before[premise] == State.ACTION_SAFE, "I1: external action without an action-safe premise"

        def _ancestors(self, rid):
            out, todo = set(), [rid]
            while todo:
                for p in self.store.record(todo.pop()).derived_from:
                    if p not in out:
                        out.add(p)
                        todo.append(p)
            return out

        @rule(data=st.data(), commit=st.booleans())
        @precondition(lambda self: self.txs)
        def finish(self, data, commit):
            tx = data.draw(st.sampled_from(self.txs))
            self.txs.remove(tx)
            if commit:
                result = tx.commit()
                if result.cascade is not None:
                    self._check_i2(result.cascade.roots)
            else:
                report = tx.abort()
                self._check_i2(report.roots)

        @rule(data=st.data(), retract=st.booleans())
        @precondition(lambda self: self.ids)
        def revoke(self, data, retract):
            rid = data.draw(st.sampled_from(self.ids))
            state = self.store.state(rid)
            if retract and state != State.TENTATIVE and state != State.REVOKED:
                self.store.retract(rid)
                self._check_i2((rid,))
            elif not retract and state in LIVE and rid not in self.store.pending():
                self.store.request_revocation(rid)

        def _check_i2(self, roots):
            states = self.store.states()
            for root in roots:
                for d in self.store.descendants(root):
                    assert states[d] not in ACTIVE, f"I2: {d} still {states[d].value} after repairing {root}"

        @invariant()
        def g3(self):
            states = self.store.states()
            for rid, s in states.items():
                if s == State.REVOKED:
                    for d in self.store.descendants(rid):
                        assert states[d] not in LIVE, f"G3: {d} {states[d].value} under revoked {rid}"

    return MemTXMachine


SETTINGS = settings(max_examples=25, stateful_step_count=14, deadline=None, database=None, derandomize=True, report_multiple_bugs=False,
                    suppress_health_check=list(HealthCheck))


def test_memtx_store_keeps_i1_i2_g3(backend_where):
    where = ":memory:" if backend_where.endswith(".db") else backend_where
    run_state_machine_as_test(machine_for(where, Features()), settings=SETTINGS)


@pytest.mark.parametrize("broken", ["gate", "cascade_summaries"])
def test_property_test_catches_broken_stores(broken):
    with pytest.raises(AssertionError, match="I1" if broken == "gate" else "I2|G3"):
        run_state_machine_as_test(machine_for(":memory:", Features().without(broken)),
                                  settings=settings(SETTINGS, max_examples=300, stateful_step_count=25, phases=[Phase.generate]))  # no shrinking: finding is the point
