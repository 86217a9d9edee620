"""A bounded exhaustive enumerator over a model of the MemTX protocol, checking I1, I2 and G3 in every reachable
state, and the replay of enumerated traces on the real store (:class:`~lab.provenance.txn.MemTXStore`).

Source: MemTX (arXiv 2607.23929) section 2.7 (``shared/notes/papers-memtx.md``): invariants I1 (action-safety
gating), I2 (cascade-repair completeness) and G3 (no committed or action-safe record with a revoked transitive
ancestor), checked by bounded enumeration (the paper: 4 records, 3 concurrent transactions, depth 10).

The model
---------
``records`` record positions, created in index order (so records need no symmetry reduction); ``txs``
transactions. A record is ``(type, state, parents, slot, evidence_ok, pending)`` with type belief, summary,
reversible or irreversible tool action; state tentative, committed, action_safe, quarantined, superseded,
revoked (``raw`` and ``validated`` never persist between steps); parents a bitmask over earlier records; slot 0
or 1 (the entity/attribute a value is about; all values differ, all records share one source and one authority,
so a newer value in the snapshot supersedes, a rival committed after the snapshot is a stale late write). A
transaction is ``(mode, snapshot, staged, actions)``: mode idle / low tier / external-action tier, the bitmask of
records committed when it began, its staged records and the tool actions it ran.

Steps (each one of the store's API calls): ``begin(t, tier)``; ``stage(t, type, parent, slot, evidence)``
(a belief with no parent or one, a summary with one; evidence bad only for beliefs); ``call(t, tool,
premise)`` for a premise in the snapshot or the transaction's own staging; ``commit(t)``; ``abort(t)``;
``request_revocation(r)``; ``retract(r)``. The step semantics mirror :mod:`lab.provenance.txn.store`
line by line (pipeline, gate, one cascade routine); :func:`replay` checks that they agree.

Canonicalisation: transactions are interchangeable (the canonical state sorts their tuples) and so are the two
slots (the canonical state is the smaller of the state and its slot-swapped image); idle transactions are
identical, so ``begin`` is tried on one of them only.

Invariants, checked independently of the step code: **I1** on every executed irreversible call, the pre-state
has no tentative record in the premise's slot (the caller's own staging included), the premise is committed
or action-safe with no pending revocation on it or an ancestor, and in an external-action transaction it is
action-safe in the snapshot. **I2** after every retraction or abort, every transitive descendant of the
repaired roots is inactive (quarantined, superseded, revoked; an action compensated or logged). **G3** in every
state, no committed or action-safe record has a revoked transitive ancestor.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from lab.provenance.errors import MemTXError

__all__ = ["Variant", "VARIANTS", "initial", "successors", "canonical", "enumerate_states", "EnumerationResult", "traces", "replay"]

# types
BELIEF, SUMMARY, ACT_REV, ACT_IRR = 0, 1, 2, 3
# states
TENT, COMM, ASAFE, QUAR, SUPER, REVK = 0, 1, 2, 3, 4, 5
ACTIVE = (TENT, COMM, ASAFE)
LIVE = (COMM, ASAFE)
# tx modes
IDLE, LOW, EXT = 0, 1, 2

STATE_NAMES = ("tentative", "committed", "action_safe", "quarantined", "superseded", "revoked")
TYPE_NAMES = ("belief", "summary", "tool_action", "tool_action")


@dataclass(frozen=True)
class Variant:
    """Which protocol the model runs: MemTX, or a deliberately broken one (the checker must catch it)."""

    name: str = "memtx"
    gate: bool = True
    cascade_summaries: bool = True


VARIANTS = {
    "memtx": Variant(),
    "gate_off": Variant("gate_off", gate=False),
    "cascade_skips_summaries": Variant("cascade_skips_summaries", cascade_summaries=False),
}


def initial(records: int = 4, txs: int = 3):
    """The empty store: no records, every transaction idle."""
    return (None,) * records, ((IDLE, 0, 0, 0),) * txs


def _ancestors(recs, mask: int) -> int:
    """``mask`` and every transitive ancestor of its records (bitmask)."""
    out = mask
    frontier = mask
    while frontier:
        nxt = 0
        i = 0
        while frontier:
            if frontier & 1 and recs[i] is not None:
                nxt |= recs[i][2]
            frontier >>= 1
            i += 1
        frontier = nxt & ~out
        out |= nxt
    return out


def _descendants(recs, roots: int) -> int:
    """Transitive descendants of ``roots``, excluding the roots (bitmask)."""
    out = 0
    frontier = roots
    n = len(recs)
    while frontier:
        nxt = 0
        for j in range(n):
            r = recs[j]
            if r is not None and r[2] & frontier and not (roots | out) & (1 << j):
                nxt |= 1 << j
        out |= nxt
        frontier = nxt
    return out


def _bits(mask: int) -> Iterator[int]:
    i = 0
    while mask:
        if mask & 1:
            yield i
        mask >>= 1
        i += 1


def _cascade(recs: list, roots: dict, variant: Variant) -> None:
    """The one repair routine (store.MemTXStore._cascade): roots to their state, descendants by type."""
    def move(i, new):
        r = recs[i]
        if r[1] == new or r[1] == REVK:
            return
        recs[i] = (r[0], new, r[2], r[3], r[4], r[5])

    rmask = 0
    for i, new in roots.items():
        rmask |= 1 << i
        if recs[i][0] >= ACT_REV:
            if recs[i][1] == COMM:
                move(i, REVK)
        else:
            move(i, new)
    for i in roots:
        r = recs[i]
        if r[5]:
            recs[i] = (r[0], r[1], r[2], r[3], r[4], 0)
    for d in _bits(_descendants(recs, rmask)):
        r = recs[d]
        if r[1] == REVK:
            continue
        if r[0] == BELIEF:
            move(d, REVK)
        elif r[0] == SUMMARY:
            if variant.cascade_summaries and r[1] not in (QUAR, SUPER):
                move(d, QUAR)
        elif r[1] == COMM:
            move(d, REVK)


def gate_allows(recs, tx, tool: int, p: int) -> bool:
    """The store's gate (Transaction.gate / _reversible_gate) on premise ``p``."""
    anc = _ancestors(recs, 1 << p)
    if tool == ACT_REV:
        for a in _bits(anc):
            if recs[a][1] in (QUAR, SUPER, REVK) or recs[a][5]:
                return False
        return True
    slot = recs[p][3]
    for r in recs:
        if r is not None and r[0] < ACT_REV and r[1] == TENT and r[3] == slot:
            return False
    if tx[0] == EXT and not (recs[p][1] == ASAFE and tx[1] >> p & 1):
        return False
    if recs[p][1] not in LIVE:
        return False
    for a in _bits(anc):
        if recs[a][5]:
            return False
    return True


def _pipeline(recs, tx) -> tuple[bool, set, list]:
    """The commit pipeline (Transaction._pipeline) on the model: (all pass, failing positions, rivals to supersede)."""
    staged = tx[2]
    failed, supersede = set(), []
    for i in _bits(staged):
        r = recs[i]
        if r[1] != TENT:
            failed.add(i)
            continue
        if r[0] == BELIEF and not r[4]:
            failed.add(i)
            continue
        bad = False
        for j, q in enumerate(recs):
            if j == i or q is None or q[0] >= ACT_REV or q[3] != r[3] or q[1] not in LIVE or staged >> j & 1:
                continue
            if not tx[1] >> j & 1:  # committed after the snapshot: stale late write
                bad = True
                break
            supersede.append(j)
        if not bad:
            for p in _bits(r[2]):
                if recs[p][1] == REVK:
                    bad = True
        if not bad and r[2]:
            anc = _ancestors(recs, r[2])
            for a in _bits(anc):
                q = recs[a]
                if q[5] or q[1] == REVK or (not staged >> a & 1 and q[1] not in LIVE):
                    bad = True
                    break
        if bad:
            failed.add(i)
    return not failed, failed, supersede


def step(state, action, variant: Variant = VARIANTS["memtx"]):
    """Apply one action; returns ``(new_state, event)`` where ``event`` is ``None`` or what the invariant
    checker needs (``("irreversible", pre_state, t, p)``, ``("repair", roots_mask)``). ``None`` new_state: refused
    (a gate refusal changes nothing)."""
    recs, txs = state
    kind = action[0]
    if kind == "begin":
        _, t, tier = action
        snap = 0
        for i, r in enumerate(recs):
            if r is not None and r[1] in LIVE:
                snap |= 1 << i
        txs = txs[:t] + ((tier, snap, 0, 0),) + txs[t + 1:]
        return (recs, txs), None
    if kind == "stage":
        _, t, typ, parent, slot, ev = action
        i = recs.index(None)
        rec = (typ, TENT, 0 if parent is None else 1 << parent, slot, ev, 0)
        recs = recs[:i] + (rec,) + recs[i + 1:]
        tx = txs[t]
        txs = txs[:t] + ((tx[0], tx[1], tx[2] | 1 << i, tx[3]),) + txs[t + 1:]
        return (recs, txs), None
    if kind == "call":
        _, t, tool, p = action
        tx = txs[t]
        if variant.gate and not gate_allows(recs, tx, tool, p):
            return None, None
        i = recs.index(None)
        event = ("irreversible", state, t, p) if tool == ACT_IRR else None
        recs = recs[:i] + ((tool, COMM, 1 << p, 0, 1, 0),) + recs[i + 1:]
        txs = txs[:t] + ((tx[0], tx[1], tx[2], tx[3] | 1 << i),) + txs[t + 1:]
        return (recs, txs), event
    if kind in ("commit", "abort"):
        t = action[1]
        tx = txs[t]
        recs = list(recs)
        if kind == "commit":
            ok, failed, supersede = _pipeline(recs, tx)
        else:
            ok, failed, supersede = False, set(), []
        roots_mask = 0
        if ok:
            for j in supersede:
                q = recs[j]
                if q[1] in LIVE:
                    recs[j] = (q[0], SUPER, q[2], q[3], q[4], q[5])
            new = ASAFE if tx[0] == EXT else COMM
            for i in _bits(tx[2]):
                q = recs[i]
                recs[i] = (q[0], new, q[2], q[3], q[4], q[5])
            event = None
        else:
            roots = {i: (QUAR if i in failed else REVK) for i in _bits(tx[2])}
            for a in _bits(tx[3]):
                if recs[a][1] == COMM:
                    roots[a] = REVK
            if roots:
                _cascade(recs, roots, variant)
            roots_mask = sum(1 << i for i in roots)
            event = ("repair", roots_mask)
        txs = txs[:t] + ((IDLE, 0, 0, 0),) + txs[t + 1:]
        return (tuple(recs), txs), event
    if kind == "request_revocation":
        r = action[1]
        q = recs[r]
        recs = recs[:r] + ((q[0], q[1], q[2], q[3], q[4], 1),) + recs[r + 1:]
        return (recs, txs), None
    if kind == "retract":
        r = action[1]
        recs = list(recs)
        _cascade(recs, {r: REVK}, variant)
        return (tuple(recs), txs), ("repair", 1 << r)
    raise MemTXError(f"unknown model action {action!r}", field="action")


def actions(state) -> Iterator[tuple]:
    """Every action enabled in ``state``."""
    recs, txs = state
    free = None in recs
    existing = [i for i, r in enumerate(recs) if r is not None and r[0] < ACT_REV]
    idle_done = False
    for t, tx in enumerate(txs):
        if tx[0] == IDLE:
            if not idle_done:
                idle_done = True
                yield ("begin", t, LOW)
                yield ("begin", t, EXT)
            continue
        if free:
            for slot in (0, 1):
                yield ("stage", t, BELIEF, None, slot, 1)
                yield ("stage", t, BELIEF, None, slot, 0)
                for p in existing:
                    yield ("stage", t, BELIEF, p, slot, 1)
                    yield ("stage", t, SUMMARY, p, slot, 1)
            for p in existing:
                if tx[1] >> p & 1 or tx[2] >> p & 1:
                    yield ("call", t, ACT_REV, p)
                    yield ("call", t, ACT_IRR, p)
        yield ("commit", t)
        yield ("abort", t)
    for i in existing:
        st, pend = recs[i][1], recs[i][5]
        if st in LIVE and not pend:
            yield ("request_revocation", i)
        if st in (COMM, ASAFE, QUAR, SUPER):
            yield ("retract", i)


def _swap(recs):
    return tuple(None if r is None else (r[0], r[1], r[2], (1 - r[3]) if r[0] < ACT_REV else r[3], r[4], r[5]) for r in recs)


def _code(r) -> int:
    return 0 if r is None else (r[0] + 1) | r[1] << 3 | r[2] << 6 | r[3] << 10 | r[4] << 11 | r[5] << 12


REC_BITS, TX_BITS = 13, 14  # a record: type+1 (3 bits), state (3), parents (4), slot, evidence, pending; a tx: mode (2), 3 x 4-bit masks
MAX_RECORDS = 4  # the packed codes hold parent and record masks of 4 bits


class _RecordCodes(dict):
    """record tuple -> (its code, its slot-swapped code); fills :data:`_REC_OF` (code -> one shared tuple) as it
    goes, so decoded states share their record objects. At most a few thousand entries."""

    def __missing__(self, r):
        sw = None if r is None else (r[0], r[1], r[2], (1 - r[3]) if r[0] < ACT_REV else r[3], r[4], r[5])
        ca, cb = _code(r), _code(sw)
        _REC_OF.setdefault(ca, r)
        _REC_OF.setdefault(cb, sw)
        c = self[r] = (ca, cb)
        return c


class _TxCodes(dict):
    """transaction tuple -> its 14-bit code; fills :data:`_TX_OF` (code -> one shared tuple)."""

    def __missing__(self, tx):
        m, sn, st, ac = tx
        c = self[tx] = m | sn << 2 | st << 6 | ac << 10
        _TX_OF.setdefault(c, tx)
        return c


_REC_OF: dict = {0: None}
_TX_OF: dict = {}
_CODES = _RecordCodes()
_TXC = _TxCodes()


def _key(state) -> tuple[int, int]:
    """``(packed canonical state, packed records of state as given)``. The canonical form sorts the transactions by
    their code (transactions are interchangeable) and, of the records and their slot swap, takes the smaller
    packing; the transactions' part is the same for both, so it is chosen on the records alone."""
    recs, txs = state
    codes = _CODES
    if len(recs) == 4:  # the paper's bound, unrolled
        a, b, c, d = codes[recs[0]], codes[recs[1]], codes[recs[2]], codes[recs[3]]
        ka = ((a[0] << REC_BITS | b[0]) << REC_BITS | c[0]) << REC_BITS | d[0]
        kb = ((a[1] << REC_BITS | b[1]) << REC_BITS | c[1]) << REC_BITS | d[1]
    else:
        ka = kb = 0
        for r in recs:
            ca, cb = codes[r]
            ka = ka << REC_BITS | ca
            kb = kb << REC_BITS | cb
    tc = _TXC
    if len(txs) == 3:
        x, y, z = tc[txs[0]], tc[txs[1]], tc[txs[2]]
        if x > y:
            x, y = y, x
        if y > z:
            y, z = z, y
            if x > y:
                x, y = y, x
        tv = (x << TX_BITS | y) << TX_BITS | z
    else:
        tv = 0
        for c in sorted([tc[t] for t in txs]):
            tv = tv << TX_BITS | c
    return ((ka if ka <= kb else kb) << (TX_BITS * len(txs)) | tv), ka


def _decode(k: int, records: int, txs: int):
    """The state a packed int stands for (inverse of the packing in :func:`_key`)."""
    tl = [None] * txs
    for j in range(txs - 1, -1, -1):
        tl[j] = _TX_OF[k & 0x3FFF]
        k >>= TX_BITS
    rl = [None] * records
    for j in range(records - 1, -1, -1):
        rl[j] = _REC_OF[k & 0x1FFF]
        k >>= REC_BITS
    return tuple(rl), tuple(tl)


def canonical(state):
    """The canonical representative: transactions sorted by their code, and of the state and its slot swap the
    one whose packed form is smaller. Returns ``(state, packed)`` (the packed int is what the visited set and the
    BFS frontier hold)."""
    k, _ = _key(state)
    return _decode(k, len(state[0]), len(state[1])), k


# -- the invariants, written apart from the step code


def check_i1(pre, t: int, p: int) -> str | None:
    """I1 on an executed irreversible call with premise ``p`` by transaction ``t`` in state ``pre``."""
    recs, txs = pre
    tx = txs[t]
    slot = recs[p][3]
    if any(r is not None and r[0] in (BELIEF, SUMMARY) and r[1] == TENT and r[3] == slot for r in recs):
        return "I1: irreversible call while a tentative record of its entity is outside the snapshot"
    if recs[p][1] not in (COMM, ASAFE):
        return "I1: irreversible call on a premise that is not committed"
    anc, frontier = {p}, [p]
    while frontier:
        q = frontier.pop()
        for a in range(len(recs)):
            if recs[q][2] >> a & 1 and a not in anc:
                anc.add(a)
                frontier.append(a)
    if any(recs[a][5] for a in anc):
        return "I1: irreversible call on a premise pending revocation"
    if tx[0] == EXT and not (recs[p][1] == ASAFE and tx[1] >> p & 1):
        return "I1: external-action call without an action-safe premise in the snapshot"
    return None


def _desc_set(recs, roots: set) -> set:
    out, frontier = set(), list(roots)
    while frontier:
        q = frontier.pop()
        for j, r in enumerate(recs):
            if r is not None and r[2] >> q & 1 and j not in out and j not in roots:
                out.add(j)
                frontier.append(j)
    return out


def check_i2(post, roots_mask: int) -> str | None:
    """I2 after a repair: every transitive descendant of the roots is inactive (actions compensated or logged)."""
    recs = post[0]
    roots = {i for i in range(len(recs)) if roots_mask >> i & 1}
    for d in _desc_set(recs, roots):
        if recs[d][1] in (TENT, COMM, ASAFE):
            return f"I2: descendant r{d} ({TYPE_NAMES[recs[d][0]]}) still {STATE_NAMES[recs[d][1]]} after a repair"
    return None


def check_g3(state) -> str | None:
    """G3: no committed or action-safe record has a revoked transitive ancestor."""
    recs = state[0]
    revoked = {i for i, r in enumerate(recs) if r is not None and r[1] == REVK}
    if not revoked:
        return None
    for d in _desc_set(recs, revoked):
        if recs[d][1] in (COMM, ASAFE):
            return f"G3: r{d} is {STATE_NAMES[recs[d][1]]} with a revoked ancestor"
    return None


def successors(state, variant: Variant = VARIANTS["memtx"]):
    """``(action, new_state or None, violation or None)`` for every enabled action; the violation is I1 or I2
    (transition invariants) or G3 of the new state."""
    for a in actions(state):
        new, event = step(state, a, variant)
        violation = None
        if new is not None:
            violation = _event_violation(new, event) or check_g3(new)
        yield a, new, violation


def _event_violation(new, event) -> str | None:
    if event is None:
        return None
    if event[0] == "irreversible":
        return check_i1(event[1], event[2], event[3])
    return check_i2(new, event[1])


@dataclass
class EnumerationResult:
    """What :func:`enumerate_states` found: canonical ``states`` (the initial one included), ``transitions``
    (enabled actions tried from states above the depth bound, refusals included), ``violations`` (count) with the
    first few as ``(message, trace)``, ``seconds``, ``per_depth`` new states per BFS level."""

    records: int
    txs: int
    depth: int
    variant: str
    states: int = 0
    transitions: int = 0
    violations: int = 0
    examples: list = field(default_factory=list)
    seconds: float = 0.0
    per_depth: list = field(default_factory=list)
    level_seconds: list = field(default_factory=list)

    @property
    def states_per_s(self) -> float:
        return self.states / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict:
        return {"records": self.records, "txs": self.txs, "depth": self.depth, "variant": self.variant, "states": self.states,
                "transitions": self.transitions, "violations": self.violations, "seconds": round(self.seconds, 2),
                "states_per_s": round(self.states_per_s, 1), "per_depth": self.per_depth,
                "cumulative_states": [sum(self.per_depth[: i + 1]) for i in range(len(self.per_depth))],
                "cumulative_seconds": [round(sum(self.level_seconds[:i]), 2) for i in range(len(self.per_depth))],
                "examples": [{"violation": m, "trace": [list(map(str, a)) for a in tr]} for m, tr in self.examples]}


def enumerate_states(records: int = 4, txs: int = 3, depth: int = 10, variant: str | Variant = "memtx", *, keep_traces: bool = False,
                     max_examples: int = 3, progress: bool = False, stop_at_first: bool = False) -> EnumerationResult:
    """Breadth-first enumeration of every canonical state reachable in at most ``depth`` actions.

    Parameters
    ----------
    records, txs, depth : int
        The bound (the paper: 4, 3, 10).
    variant : str or Variant
        ``"memtx"`` or a broken variant from :data:`VARIANTS`.
    keep_traces : bool
        Keep a predecessor per state so that violations come with their trace (memory: small bounds only).
    progress : bool
        A tqdm bar per BFS level.

    Returns
    -------
    EnumerationResult
    """
    v = VARIANTS[variant] if isinstance(variant, str) else variant
    gc_was = gc.isenabled()
    gc.disable()  # millions of small tuples and no cycles: the collector's full passes would dominate
    try:
        return _enumerate(records, txs, depth, v, keep_traces, max_examples, progress, stop_at_first)
    finally:
        if gc_was:
            gc.enable()


def _enumerate(records, txs, depth, v, keep_traces, max_examples, progress, stop_at_first) -> EnumerationResult:
    """Layer-by-layer BFS over packed canonical states: the visited set and the frontier hold ints (a state is
    decoded from its int when it is expanded), and the invariant checks, pure functions of the records (and of the
    transaction for I1), are memoised on the packed records."""
    if not 1 <= records <= MAX_RECORDS:
        raise MemTXError(f"records={records}: the packed encoding holds 1 to {MAX_RECORDS} records", field="records")
    res = EnumerationResult(records, txs, depth, v.name)
    t0 = time.perf_counter()
    k0, _ = _key(initial(records, txs))
    visited = {k0}
    pred = {k0: None} if keep_traces else None
    frontier = [k0]
    res.per_depth.append(1)
    shift = TX_BITS * txs
    g3_memo: dict = {}  # packed records -> G3 message or None
    ev_memo: dict = {}  # (kind, packed inputs) -> I1 / I2 message or None
    memo_cap = 1 << 22
    key, visit = _key, visited.add
    for level in range(depth):
        nxt = []
        last, n_last = level == depth - 1 and pred is None, 0
        it = frontier
        if progress:
            from tqdm import tqdm

            it = tqdm(frontier, desc=f"depth {level + 1}/{depth}", unit="state", mininterval=2.0, leave=False)
        if len(g3_memo) > memo_cap:
            g3_memo.clear()
        if len(ev_memo) > memo_cap:
            ev_memo.clear()
        n_tr = 0
        for ks in it:
            s = _decode(ks, records, txs)
            rs = ks >> shift
            for a in actions(s):
                n_tr += 1
                new, event = step(s, a, v)
                if new is None:
                    continue
                k, ra = key(new)
                if event is None:
                    violation = None
                else:
                    if event[0] == "irreversible":
                        tx = s[1][event[2]]
                        mk = (1, rs, tx[0], tx[1], event[3])
                    else:
                        mk = (2, ra, event[1])
                    violation = ev_memo.get(mk, 0)
                    if violation == 0:
                        violation = ev_memo[mk] = _event_violation(new, event)
                fresh = k not in visited
                if violation is None and fresh:
                    # a state invariant: checked once per canonical state (G3 is blind to slot and tx symmetry)
                    violation = g3_memo.get(ra, 0)
                    if violation == 0:
                        violation = g3_memo[ra] = check_g3(new)
                if violation is not None:
                    res.violations += 1
                    if len(res.examples) < max_examples:
                        tr = _trace(pred, ks) + [a] if pred is not None else [a]
                        res.examples.append((violation, tr))
                    if stop_at_first:
                        res.transitions += n_tr
                        res.states = len(visited)
                        res.seconds = time.perf_counter() - t0
                        return res
                if not fresh:
                    continue
                visit(k)
                if pred is not None:
                    pred[k] = (ks, a)
                if last:
                    n_last += 1  # the last level is never expanded: count it, do not keep it
                else:
                    nxt.append(k)
        res.transitions += n_tr
        res.per_depth.append(len(nxt) + n_last)
        res.level_seconds.append(time.perf_counter() - t0 - sum(res.level_seconds))
        frontier = nxt
    res.states = len(visited)
    res.seconds = time.perf_counter() - t0
    return res


def _trace(pred, k) -> list:
    out = []
    while pred[k] is not None:
        k, a = pred[k]
        out.append(a)
    return out[::-1]


def traces(n: int, *, records: int = 4, txs: int = 3, depth: int = 8, seed: int = 0) -> list[list[tuple]]:
    """``n`` random walks of up to ``depth`` state-changing actions from the empty store, taken through the
    enumerator's own successor relation on raw (uncanonicalised) states, so they replay verbatim. Each step
    first draws a kind of action uniformly (begin, stage, call, commit, abort, request_revocation, retract),
    then one of that kind."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = initial(records, txs)
        tr = []
        for _ in range(rng.randint(1, depth)):
            opts: dict[str, list] = {}
            for a, new, _ in successors(s):
                if new is not None:
                    opts.setdefault(a[0], []).append((a, new))
            if not opts:
                break
            a, s = rng.choice(opts[rng.choice(sorted(opts))])  # a kind of step first, so that rare kinds are taken
            tr.append(a)
        out.append(tr)
    return out


def replay(trace: list[tuple], store_factory, *, records: int = 4, txs: int = 3) -> list[str]:
    """Run a model trace on the real store and compare, after every step, every record's lifecycle state and
    pending flag, and the gate's decision on every call the model could make next. Returns the mismatches
    (empty: model and implementation agree).

    ``store_factory()`` returns a fresh :class:`~lab.provenance.txn.MemTXStore`.
    """
    from lab.provenance.txn.records import Tier

    store = store_factory()
    store.register_tool("rev", irreversible=False, run=lambda a: None, compensate=lambda a: None)
    store.register_tool("irr", irreversible=True, run=lambda a: None)
    s = initial(records, txs)
    ids: dict[int, str] = {}
    open_tx: dict[int, object] = {}
    bad: list[str] = []
    try:
        for k, a in enumerate(trace):
            kind = a[0]
            if kind == "begin":
                open_tx[a[1]] = store.begin(f"agent{a[1]}", tier=Tier.EXTERNAL_ACTION if a[2] == EXT else Tier.LOW)
            elif kind == "stage":
                _, t, typ, parent, slot, ev = a
                i = s[0].index(None)
                ids[i] = f"r{i}"
                open_tx[t].stage(dict(id=ids[i], type=TYPE_NAMES[typ], entity=f"slot{slot}", attribute="v", value=f"value{i}",
                                      evidence=dict(source="src", authority=0.5, confidence=0.9 if ev else 0.3),
                                      permission=dict(owner="agents", scope="shared"), derived_from=() if parent is None else (ids[parent],)))
            elif kind == "call":
                _, t, tool, p = a
                call = open_tx[t].call_tool("irr" if tool == ACT_IRR else "rev", {"n": k}, uses=[ids[p]])
                if call.decision.allowed:
                    ids[s[0].index(None)] = call.action
            elif kind == "commit":
                open_tx.pop(a[1]).commit()
            elif kind == "abort":
                open_tx.pop(a[1]).abort()
            elif kind == "request_revocation":
                store.request_revocation(ids[a[1]])
            elif kind == "retract":
                store.retract(ids[a[1]])
            new, _ = step(s, a)
            if kind == "call" and new is None:
                if call.decision.allowed:
                    bad.append(f"step {k} {a}: the model refuses, the store allowed")
                continue
            if kind == "call" and not call.decision.allowed:
                bad.append(f"step {k} {a}: the model allows, the store refused {call.decision.reasons}")
                break
            s = new
            states = store.states()
            pend = store.pending()
            for i, r in enumerate(s[0]):
                if r is None:
                    continue
                got = states.get(ids[i])
                if got is None or got.value != STATE_NAMES[r[1]]:
                    bad.append(f"step {k} {a}: r{i} model {STATE_NAMES[r[1]]}, store {got}")
                if bool(r[5]) != (ids[i] in pend):
                    bad.append(f"step {k} {a}: r{i} pending model {bool(r[5])}, store {ids[i] in pend}")
            for t, tx in open_tx.items():
                for i, r in enumerate(s[0]):
                    if r is None or r[0] >= ACT_REV:
                        continue
                    for tool, name in ((ACT_REV, "rev"), (ACT_IRR, "irr")):
                        want = gate_allows(s[0], s[1][t], tool, i)
                        got = tx.gate(name, uses=[ids[i]]).allowed
                        if want != got:
                            bad.append(f"step {k} {a}: gate({name}, r{i}) for tx {t}: model {want}, store {got}")
            if bad:
                break
    finally:
        store.close()
    return bad
