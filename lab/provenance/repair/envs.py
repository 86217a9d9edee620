"""Deterministic, resettable tool environments for the replayable agent runner.

Three domains with real-looking state:

``airline``  the tau-bench airline databases (users, reservations, flights; ``lab.data``
             ``tau_bench_airline_*``, sierra-research/tau-bench, MIT), with tau-bench's read tools and its
             write tools as field updates of a reservation.
``shop``     an online shop generated from a seed: customers (address, tier, saved cards), products (price,
             stock), orders (items, status, total), product reviews written by the public (untrusted).
``support``  a support desk generated from a seed: customers (plan, SLA), tickets (product, severity, status),
             knowledge-base articles (fix, SLA hours) and a community forum (untrusted).

Every tool is a :class:`Tool`: a read returns JSON (never changes state); a write changes one row's fields and
returns the row; it is **reversible** when its previous field values can be put back (the registered
compensation, :meth:`ToolEnv.compensate`), **irreversible** otherwise (money paid out, an e-mail sent), which
:meth:`ToolEnv.compensate` refuses (:class:`~lab.provenance.errors.IrreversibleEffectError`) and repair reports.
:meth:`ToolEnv.reset` puts the whole state back as it was created (the *resettable interface*).
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lab.provenance.errors import IrreversibleEffectError, RepairError

__all__ = ["Tool", "Effect", "ToolEnv", "airline_env", "shop_env", "support_env", "make_env", "DOMAINS"]

DOMAINS = ("airline", "shop", "support")


@dataclass(frozen=True)
class Tool:
    """A tool of an environment.

    ``kind``: ``"read"`` or ``"write"``. A read's ``fn(db, args)`` returns JSON. A write names its ``table``,
    the argument that holds the row id (``id_arg``) and ``fields`` (argument name -> row field it sets);
    ``reversible``: whether the previous values may be restored. ``trust``: how far the tool's results are
    trusted (an untrusted channel, e.g. public reviews, has less than 1).
    """

    name: str
    kind: str
    fn: Callable[[dict, dict], Any] | None = None
    table: str | None = None
    id_arg: str | None = None
    fields: dict[str, str] = field(default_factory=dict)
    reversible: bool = True
    trust: float = 1.0


@dataclass(frozen=True)
class Effect:
    """A write's side effect: ``id``, the tool and arguments, and the row's field values before it."""

    id: str
    tool: str
    args: dict
    table: str
    row: str
    before: dict
    reversible: bool


class ToolEnv:
    """A deterministic tool environment over a JSON database (``{table: {row id: row}}``).

    Parameters
    ----------
    domain : str
    db : dict
        Copied; :meth:`reset` restores this copy.
    tools : list of Tool

    Raises
    ------
    RepairError
        :meth:`call` of an unknown tool, or a write naming a row that does not exist (names the tool and id).
    """

    def __init__(self, domain: str, db: dict, tools: list[Tool]):
        self.domain = domain
        self._initial = copy.deepcopy(db)
        self.db = copy.deepcopy(db)
        self.tools = {t.name: t for t in tools}
        self.journal: list[Effect] = []
        self.overrides: dict[str, Any] = {}

    def reset(self) -> None:
        """Back to the state the environment was created with (journal emptied)."""
        self.db = copy.deepcopy(self._initial)
        self.journal = []

    def tool(self, name: str) -> Tool:
        if name not in self.tools:
            raise RepairError(f"{self.domain}: no tool {name!r}", step=None)
        return self.tools[name]

    def call(self, name: str, args: dict, *, effect_id: str | None = None) -> Any:
        """Run tool ``name`` with ``args``; a write is journaled as an :class:`Effect` with id ``effect_id``."""
        tool = self.tool(name)
        call_key = f"{name}({json.dumps(args, sort_keys=True)})"
        if tool.kind == "read":
            if call_key in self.overrides:
                return copy.deepcopy(self.overrides[call_key])
            return copy.deepcopy(tool.fn(self.db, args))
        table = self.db.setdefault(tool.table, {})
        if tool.id_arg is None:  # a call that creates its own row (a booking, a certificate), keyed by the effect
            eid = effect_id or f"effect{len(self.journal)}"
            row = eid.split("@")[0]  # a replayed call creates the row its first execution created
            table[row] = {"call": name, **copy.deepcopy(args)}
            self.journal.append(Effect(eid, name, copy.deepcopy(args), tool.table, row, {"__created__": True}, tool.reversible))
            return copy.deepcopy(table[row])
        row_id = str(args.get(tool.id_arg))
        if row_id not in table:
            raise RepairError(f"{self.domain}: {name} names {tool.id_arg}={row_id!r}, which {tool.table} does not hold", step=effect_id)
        row = table[row_id]
        before = {f: copy.deepcopy(row.get(f)) for f in tool.fields.values()}
        for arg, f in tool.fields.items():
            if arg in args:
                row[f] = copy.deepcopy(args[arg])
        self.journal.append(Effect(effect_id or f"effect{len(self.journal)}", name, copy.deepcopy(args), tool.table, row_id, before, tool.reversible))
        return copy.deepcopy(row)

    def compensate(self, effect_id: str) -> None:
        """Undo a journaled effect by restoring the row's previous values (the registered compensation).

        Raises
        ------
        IrreversibleEffectError
            The effect's tool is irreversible (names the effect and tool).
        RepairError
            No such effect in the journal.
        """
        for i, e in enumerate(self.journal):
            if e.id == effect_id:
                if not e.reversible:
                    raise IrreversibleEffectError(f"effect {effect_id} ({e.tool}) cannot be undone", step=effect_id)
                if e.before.get("__created__"):
                    del self.db[e.table][e.row]
                    del self.journal[i]
                    return
                row = self.db[e.table][e.row]
                for f, v in e.before.items():
                    if v is None:
                        row.pop(f, None)
                    else:
                        row[f] = copy.deepcopy(v)
                del self.journal[i]
                return
        raise RepairError(f"no effect {effect_id!r} in the journal", step=effect_id)

    def state(self) -> dict:
        """The database (a deep copy), for comparison with an oracle's."""
        return copy.deepcopy(self.db)

    def outcome(self) -> dict:
        """The state the agent acts on: the tables its write tools change (a deep copy). Planted public
        content (a review, a forum post) is the world's, not an outcome, and is left out."""
        return {t: copy.deepcopy(self.db.get(t, {})) for t in sorted({tool.table for tool in self.tools.values() if tool.kind == "write"})}

    def copy(self) -> ToolEnv:
        """An independent copy (its own database and journal; the initial state and the recorded read results,
        which nothing changes, are shared)."""
        env = ToolEnv.__new__(ToolEnv)
        env.domain, env._initial, env.tools = self.domain, self._initial, dict(self.tools)
        env.db = copy.deepcopy(self.db)
        env.journal = list(self.journal)
        env.overrides = self.overrides
        return env


def _get(table: str, arg: str) -> Callable[[dict, dict], Any]:
    def fn(db: dict, args: dict) -> Any:
        row = db.get(table, {}).get(str(args.get(arg)))
        return {"error": f"{table[:-1]} not found"} if row is None else row

    return fn


def _by_topic(table: str) -> Callable[[dict, dict], Any]:
    def fn(db: dict, args: dict) -> Any:
        return [r for r in db.get(table, {}).values() if r.get("topic") == args.get("topic")]

    return fn


# --- airline (tau-bench) --------------------------------------------------------------------------------


def _flight_status(db: dict, args: dict) -> Any:
    f = db["flights"].get(str(args.get("flight_number")))
    if f is None:
        return {"error": "flight not found"}
    return f["dates"].get(str(args.get("date")), {"status": "not scheduled"})


def airline_env(db: dict | None = None) -> ToolEnv:
    """The tau-bench airline domain (``lab.provenance.tasks.airline_db()`` unless ``db`` is given), plus a
    public travel forum (untrusted, trust 0.3) and the certificate ledger (irreversible)."""
    if db is None:
        from lab.provenance.tasks import airline_db

        src = airline_db()
        db = {"users": src["users"], "reservations": src["reservations"], "flights": src["flights"], "forum": {}, "ledger": {}}
    tools = [
        Tool("get_user_details", "read", _get("users", "user_id")),
        Tool("get_reservation_details", "read", _get("reservations", "reservation_id")),
        Tool("get_flight_status", "read", _flight_status),
        Tool("search_forum", "read", _by_topic("forum"), trust=0.3),
        Tool("update_reservation_baggages", "write", table="reservations", id_arg="reservation_id", fields={"total_baggages": "total_baggages", "nonfree_baggages": "nonfree_baggages", "payment_id": "baggage_payment_id"}),
        Tool("update_reservation_flights", "write", table="reservations", id_arg="reservation_id", fields={"cabin": "cabin", "payment_id": "change_payment_id"}),
        Tool("cancel_reservation", "write", table="reservations", id_arg="reservation_id", fields={"status": "status", "refund_to": "refund_to"}),
        Tool("send_certificate", "write", table="ledger", id_arg="user_id", fields={"amount": "certificate_amount"}, reversible=False),
    ]
    return ToolEnv("airline", db, tools)


# --- shop ------------------------------------------------------------------------------------------------

_FIRST = ["ana", "ben", "chloe", "dev", "elif", "farah", "gus", "hana", "ivan", "jin", "kofi", "lena", "mateo", "nia", "omar", "priya"]
_LAST = ["adams", "bauer", "costa", "diaz", "evans", "fischer", "garcia", "huang", "ito", "jones"]
_STREETS = ["Maple Ave", "Harbor St", "Elm Road", "Cedar Lane", "Sunset Drive", "Birch Court"]
_CITIES = [("Austin", "TX", "787"), ("Denver", "CO", "802"), ("Portland", "OR", "972"), ("Boston", "MA", "021"), ("Tampa", "FL", "336")]
_PRODUCTS = ["espresso machine", "trail backpack", "desk lamp", "wireless earbuds", "cast iron pan", "yoga mat", "rain jacket", "blender"]


def shop_db(seed: int = 0, n_customers: int = 40) -> dict:
    """A shop database generated from ``seed``: customers, products, orders, reviews, payouts."""
    rng = random.Random(f"shop/{seed}")
    products = {}
    for i, name in enumerate(_PRODUCTS):
        pid = f"P{1000 + 37 * i}"
        products[pid] = {"id": pid, "name": name, "price": rng.randrange(19, 400), "stock": rng.randrange(0, 60), "warranty_months": rng.choice([6, 12, 24])}
    customers, orders = {}, {}
    for c in range(n_customers):
        cid = f"{rng.choice(_FIRST)}_{rng.choice(_LAST)}_{rng.randrange(1000, 9999)}"
        city, state, zip3 = rng.choice(_CITIES)
        cards = [f"card_{rng.randrange(1000000, 9999999)}" for _ in range(rng.randrange(1, 3))]
        customers[cid] = {
            "id": cid,
            "address": f"{rng.randrange(10, 999)} {rng.choice(_STREETS)}, {city} {state} {zip3}{rng.randrange(10, 99)}",
            "tier": rng.choice(["silver", "gold", "platinum"]),
            "cards": cards,
            "default_card": cards[0],
        }
        for _ in range(rng.randrange(1, 3)):
            oid = f"O{rng.randrange(10000, 99999)}"
            pid = rng.choice(list(products))
            qty = rng.randrange(1, 4)
            orders[oid] = {"id": oid, "customer": cid, "product": pid, "quantity": qty, "status": rng.choice(["processing", "shipped", "delivered"]), "total": qty * products[pid]["price"], "ship_to": customers[cid]["address"]}
    return {"customers": customers, "products": products, "orders": orders, "reviews": {}, "payouts": {cid: {"id": cid} for cid in customers}}


def shop_env(seed: int = 0, db: dict | None = None) -> ToolEnv:
    """The shop domain (:func:`shop_db`); reviews are public (trust 0.3); refunds are paid out (irreversible)."""
    tools = [
        Tool("get_customer", "read", _get("customers", "customer_id")),
        Tool("get_order", "read", _get("orders", "order_id")),
        Tool("get_product", "read", _get("products", "product_id")),
        Tool("read_reviews", "read", _by_topic("reviews"), trust=0.3),
        Tool("update_shipping", "write", table="orders", id_arg="order_id", fields={"address": "ship_to"}),
        Tool("exchange_item", "write", table="orders", id_arg="order_id", fields={"product_id": "product", "price_difference": "price_difference", "card": "exchange_card"}),
        Tool("cancel_order", "write", table="orders", id_arg="order_id", fields={"status": "status", "refund_card": "refund_card"}),
        Tool("refund_payment", "write", table="payouts", id_arg="customer_id", fields={"amount": "refunded", "card": "refund_card"}, reversible=False),
    ]
    return ToolEnv("shop", db if db is not None else shop_db(seed), tools)


# --- support desk ----------------------------------------------------------------------------------------

_SUPPORT_PRODUCTS = ["router X2", "mesh node M5", "smart plug S1", "camera C3", "thermostat T7"]
_FIXES = ["firmware 4.2.1", "factory reset", "replace power adapter", "re-pair over WPS", "firmware 3.9.8", "clear DNS cache"]


def support_db(seed: int = 0, n_customers: int = 40) -> dict:
    """A support-desk database generated from ``seed``: customers, tickets, knowledge-base articles, forum, outbox."""
    rng = random.Random(f"support/{seed}")
    kb = {}
    for i, prod in enumerate(_SUPPORT_PRODUCTS):
        for j in range(2):
            aid = f"KB{200 + 10 * i + j}"
            kb[aid] = {"id": aid, "product": prod, "fix": rng.choice(_FIXES), "sla_hours": rng.choice([4, 8, 24, 48]), "topic": f"{prod}/issue{j}"}
    customers, tickets = {}, {}
    for c in range(n_customers):
        cid = f"C{rng.randrange(100000, 999999)}"
        customers[cid] = {"id": cid, "name": f"{rng.choice(_FIRST).title()} {rng.choice(_LAST).title()}", "plan": rng.choice(["basic", "pro", "enterprise"]), "email": f"user{rng.randrange(1000, 9999)}@example.net", "agent": f"AG{rng.randrange(10, 60)}"}
        for _ in range(rng.randrange(1, 3)):
            tid = f"T{rng.randrange(100000, 999999)}"
            art = rng.choice(list(kb))
            tickets[tid] = {"id": tid, "customer": cid, "article": art, "product": kb[art]["product"], "severity": rng.choice(["low", "medium", "high"]), "status": "open", "priority": "normal"}
    return {"customers": customers, "tickets": tickets, "kb": kb, "forum": {}, "outbox": {cid: {"id": cid} for cid in customers}}


def support_env(seed: int = 0, db: dict | None = None) -> ToolEnv:
    """The support desk (:func:`support_db`); the community forum is untrusted (0.3); e-mails are irreversible."""
    tools = [
        Tool("get_ticket", "read", _get("tickets", "ticket_id")),
        Tool("get_customer", "read", _get("customers", "customer_id")),
        Tool("get_kb_article", "read", _get("kb", "article_id")),
        Tool("search_community", "read", _by_topic("forum"), trust=0.3),
        Tool("set_priority", "write", table="tickets", id_arg="ticket_id", fields={"priority": "priority", "due_hours": "due_hours"}),
        Tool("apply_fix", "write", table="tickets", id_arg="ticket_id", fields={"fix": "fix", "status": "status"}),
        Tool("assign_agent", "write", table="tickets", id_arg="ticket_id", fields={"agent": "agent"}),
        Tool("send_email", "write", table="outbox", id_arg="customer_id", fields={"body": "last_email"}, reversible=False),
    ]
    return ToolEnv("support", db if db is not None else support_db(seed), tools)


def make_env(domain: str, seed: int = 0) -> ToolEnv:
    """The environment of ``domain`` (one of :data:`DOMAINS`)."""
    if domain == "airline":
        return airline_env()
    if domain == "shop":
        return shop_env(seed)
    if domain == "support":
        return support_env(seed)
    raise RepairError(f"unknown domain {domain!r}; one of {DOMAINS}", step=None)
