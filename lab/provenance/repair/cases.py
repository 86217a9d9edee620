"""The controlled rollback-repair benchmark: 3 domains x 4 failure types, each case with its oracle.

A case is one agent **session** of ``1 + n_other`` requests (``GeneratorKnobs``) in one domain (the tau-bench
airline databases, the shop, the support desk: :mod:`lab.provenance.repair.envs`); one request (the *main*
one, at a random position) is hit by one memory fault, and the session ends with the answer to it. Each
request is a scripted policy fragment: cached lookups of the customer, reads of the order / reservation /
ticket and of what they refer to, a read of an untrusted public channel (reviews, forum), derivations through
the domain's policy tables, claims, write actions, and (support desk, with probability ``p_email``) an
irreversible e-mail. Failure types (arXiv 2608.10502's four):

``poisoned``      the public channel carries a planted value for a key the agent also read from the system of
                  record (a price, a bag allowance, a fix); the agent writes it last, so it wins.
``stale``         a prior session left a record that was true once (an old address, a removed card, a
                  reassigned agent); the cached lookup reuses it instead of reading the system.
``misattributed`` a prior session stored another customer's value under this customer (a card, an e-mail).
``derived``       a prior record of the customer's tier / plan is wrong, and the fault reaches the action through
                  a derivation (discount, bag allowance, SLA hours); a follow-up query reads the derived value.

The **oracle** is the same policy run on the clean data (no planted value; the prior record as it should
be), giving the oracle answer, environment state and memory; every case also has a follow-up query (a later
session's cached lookups) whose clean answer defines recurrence. The generator's knobs (:class:`GeneratorKnobs`)
are fixed and separate from the planner's rules, which are chosen on cases generated with another seed.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from lab.provenance.repair.envs import DOMAINS, ToolEnv, airline_env, shop_db, shop_env, support_db, support_env
from lab.provenance.repair.runner import Program, Ref, StepSpec
from lab.provenance.repair.store import MemoryRecord, MemTXMemory

__all__ = ["FAILURES", "GeneratorKnobs", "Case", "generate_cases", "make_case"]

FAILURES = ("poisoned", "stale", "misattributed", "derived")


class GeneratorKnobs(BaseModel):
    """The case generator's knobs (fixed; never tuned against the planner)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_other: int = 3  # benign requests in the session besides the faulty one
    n_prior_unrelated: int = 6  # prior-session records about other customers
    p_email: float = 0.2  # support desk: the main request ends with an (irreversible) e-mail


@dataclass
class Case:
    """One benchmark case: the ``program``; the faulty world (``env``, ``store`` before the run) and the clean
    one (``clean_env``, ``clean_store``); the diagnosed ``faulty`` ids -> failure type; ``meta``; ``inject``:
    memory writes the failed run corrupts (``{record id: value}``, the stress test's poisoned writes)."""

    id: str
    domain: str
    failure: str
    program: Program
    env: ToolEnv
    store: MemTXMemory
    clean_env: ToolEnv
    clean_store: MemTXMemory
    faulty: dict[str, str]
    meta: dict[str, Any] = field(default_factory=dict)
    inject: dict[str, Any] = field(default_factory=dict)


def _prior(store: MemTXMemory, key: str, value: Any, t: int, tag: str = "") -> str:
    rid = f"prior/{key}{tag}"
    store.write(MemoryRecord(rid, key, value, t, 1.0, "prior"))
    return rid


# --- per-domain request templates ----------------------------------------------------------------------


def _airline_request(q: str, db: dict, user: str, res: str) -> tuple[list[StepSpec], list[tuple[str, str]], dict]:
    u, r = db["users"][user], db["reservations"][res]
    pm = next(iter(u["payment_methods"]))
    free = json.dumps({"regular": 1, "silver": 2, "gold": 3})
    steps = [
        StepSpec(f"{q}.user", "fetch", "get_user_details", {"user_id": user}, ((f"user:{user}/membership", "membership"), (f"user:{user}/payment_id", f"payment_methods/{pm}/id")), cache=True),
        StepSpec(f"{q}.res", "fetch", "get_reservation_details", {"reservation_id": res}, ((f"res:{res}/cabin", "cabin"), (f"res:{res}/total_baggages", "total_baggages"), (f"res:{res}/flight_number", "flights/0/flight_number"), (f"res:{res}/date", "flights/0/date"))),
        StepSpec(f"{q}.status", "fetch", "get_flight_status", {"flight_number": Ref(f"res:{res}/flight_number"), "date": Ref(f"res:{res}/date")}, ((f"flight:{res}/status", "status"),)),
        StepSpec(f"{q}.allow", "derive", key=f"policy:{user}/free_bags", fn="map", inputs=(f"user:{user}/membership",), template=free),
        StepSpec(f"{q}.forum", "fetch", "search_forum", {"topic": f"bags/{res}"}, ((f"policy:{user}/free_bags", "0/free_bags"),)),
        StepSpec(f"{q}.total", "derive", key=f"bags:{res}/total", fn="inc", inputs=(f"res:{res}/total_baggages",)),
        StepSpec(f"{q}.paid", "derive", key=f"bags:{res}/nonfree", fn="excess", inputs=(f"bags:{res}/total", f"policy:{user}/free_bags")),
        StepSpec(f"{q}.c1", "claim", inputs=(f"res:{res}/flight_number", f"res:{res}/date", f"flight:{res}/status"), template="Flight {0} on {1} is {2}."),
        StepSpec(f"{q}.c2", "claim", inputs=(f"bags:{res}/total", f"bags:{res}/nonfree", f"user:{user}/payment_id"), template="You will have {0} bags, {1} of them paid with {2}."),
        StepSpec(f"{q}.bags", "action", "update_reservation_baggages", {"reservation_id": res, "total_baggages": Ref(f"bags:{res}/total"), "nonfree_baggages": Ref(f"bags:{res}/nonfree"), "payment_id": Ref(f"user:{user}/payment_id")}),
    ]
    answer = StepSpec(f"{q}.answer", "answer", inputs=(f"res:{res}/cabin",), template="Done ({0} cabin).", claims=(f"{q}.c2",))
    prior_keys = [(f"user:{user}/membership", u["membership"]), (f"user:{user}/payment_id", pm)]
    follow = [steps[0], StepSpec(f"{q}.f.allow", "derive", key=f"policy:{user}/free_bags", fn="map", inputs=(f"user:{user}/membership",), template=free, cache=True),
              StepSpec(f"{q}.f.answer", "answer", inputs=(f"user:{user}/payment_id", f"policy:{user}/free_bags"), template="card {0}, free bags {1}")]
    return steps + [answer], prior_keys, {"follow": follow, "user": user, "res": res}


def _shop_request(q: str, db: dict, cust: str, order: str, p2: str) -> tuple[list[StepSpec], list[tuple[str, str]], dict]:
    c = db["customers"][cust]
    disc = json.dumps({"silver": 0, "gold": 10, "platinum": 20})
    steps = [
        StepSpec(f"{q}.cust", "fetch", "get_customer", {"customer_id": cust}, ((f"cust:{cust}/address", "address"), (f"cust:{cust}/card", "default_card"), (f"cust:{cust}/tier", "tier")), cache=True),
        StepSpec(f"{q}.order", "fetch", "get_order", {"order_id": order}, ((f"order:{order}/total", "total"), (f"order:{order}/ship_to", "ship_to"), (f"order:{order}/status", "status"))),
        StepSpec(f"{q}.product", "fetch", "get_product", {"product_id": p2}, ((f"product:{p2}/price", "price"), (f"product:{p2}/warranty", "warranty_months"))),
        StepSpec(f"{q}.reviews", "fetch", "read_reviews", {"topic": p2}, ((f"product:{p2}/price", "0/price"),)),
        StepSpec(f"{q}.disc", "derive", key=f"cust:{cust}/discount", fn="map", inputs=(f"cust:{cust}/tier",), template=disc),
        StepSpec(f"{q}.diff", "derive", key=f"quote:{order}/diff", fn="difference", inputs=(f"product:{p2}/price", f"order:{order}/total")),
        StepSpec(f"{q}.charge", "derive", key=f"quote:{order}/charge", fn="difference", inputs=(f"quote:{order}/diff", f"cust:{cust}/discount")),
        StepSpec(f"{q}.c1", "claim", inputs=(f"product:{p2}/warranty", f"product:{p2}/price"), template="The replacement has a {0}-month warranty and costs ${1}."),
        StepSpec(f"{q}.c2", "claim", inputs=(f"quote:{order}/charge", f"cust:{cust}/card", f"cust:{cust}/address"), template="We will charge ${0} to {1} and ship to {2}."),
        StepSpec(f"{q}.exchange", "action", "exchange_item", {"order_id": order, "product_id": p2, "price_difference": Ref(f"quote:{order}/charge"), "card": Ref(f"cust:{cust}/card")}),
        StepSpec(f"{q}.ship", "action", "update_shipping", {"order_id": order, "address": Ref(f"cust:{cust}/address")}),
    ]
    answer = StepSpec(f"{q}.answer", "answer", inputs=(f"order:{order}/status",), template="Exchange placed (order was {0}).", claims=(f"{q}.c1", f"{q}.c2"))
    prior_keys = [(f"cust:{cust}/address", c["address"]), (f"cust:{cust}/card", c["default_card"]), (f"cust:{cust}/tier", c["tier"])]
    follow = [steps[0], StepSpec(f"{q}.f.disc", "derive", key=f"cust:{cust}/discount", fn="map", inputs=(f"cust:{cust}/tier",), template=disc, cache=True),
              StepSpec(f"{q}.f.answer", "answer", inputs=(f"cust:{cust}/address", f"cust:{cust}/card", f"cust:{cust}/discount"), template="{0}; {1}; {2}% off")]
    return steps + [answer], prior_keys, {"follow": follow, "cust": cust, "order": order, "product": p2}


def _support_request(q: str, db: dict, cust: str, ticket: str, email: bool) -> tuple[list[StepSpec], list[tuple[str, str]], dict]:
    c, t = db["customers"][cust], db["tickets"][ticket]
    hours = json.dumps({"basic": 48, "pro": 24, "enterprise": 8})
    steps = [
        StepSpec(f"{q}.cust", "fetch", "get_customer", {"customer_id": cust}, ((f"cust:{cust}/plan", "plan"), (f"cust:{cust}/email", "email"), (f"cust:{cust}/agent", "agent")), cache=True),
        StepSpec(f"{q}.ticket", "fetch", "get_ticket", {"ticket_id": ticket}, ((f"ticket:{ticket}/article", "article"), (f"ticket:{ticket}/severity", "severity"), (f"ticket:{ticket}/product", "product"))),
        StepSpec(f"{q}.kb", "fetch", "get_kb_article", {"article_id": Ref(f"ticket:{ticket}/article")}, ((f"kb:{ticket}/fix", "fix"), (f"kb:{ticket}/sla_hours", "sla_hours"))),
        StepSpec(f"{q}.forum", "fetch", "search_community", {"topic": db["kb"][t["article"]]["topic"]}, ((f"kb:{ticket}/fix", "0/fix"),)),
        StepSpec(f"{q}.plan", "derive", key=f"sla:{cust}/plan_hours", fn="map", inputs=(f"cust:{cust}/plan",), template=hours),
        StepSpec(f"{q}.due", "derive", key=f"sla:{ticket}/due", fn="min", inputs=(f"kb:{ticket}/sla_hours", f"sla:{cust}/plan_hours")),
        StepSpec(f"{q}.c1", "claim", inputs=(f"kb:{ticket}/fix", f"ticket:{ticket}/product"), template="Apply {0} to your {1}."),
        StepSpec(f"{q}.c2", "claim", inputs=(f"cust:{cust}/agent", f"sla:{ticket}/due"), template="Agent {0} will follow up within {1} hours."),
        StepSpec(f"{q}.c3", "claim", inputs=(f"cust:{cust}/email",), template="Updates go to {0}."),
        StepSpec(f"{q}.fix", "action", "apply_fix", {"ticket_id": ticket, "fix": Ref(f"kb:{ticket}/fix"), "status": "pending"}),
        StepSpec(f"{q}.prio", "action", "set_priority", {"ticket_id": ticket, "priority": Ref(f"ticket:{ticket}/severity"), "due_hours": Ref(f"sla:{ticket}/due")}),
        StepSpec(f"{q}.assign", "action", "assign_agent", {"ticket_id": ticket, "agent": Ref(f"cust:{cust}/agent")}),
    ]
    if email:
        steps.append(StepSpec(f"{q}.email", "action", "send_email", {"customer_id": cust, "body": Ref(f"kb:{ticket}/fix")}))
    answer = StepSpec(f"{q}.answer", "answer", inputs=(f"ticket:{ticket}/severity",), template="Ticket updated ({0}).", claims=(f"{q}.c1", f"{q}.c2", f"{q}.c3"))
    prior_keys = [(f"cust:{cust}/plan", c["plan"]), (f"cust:{cust}/email", c["email"]), (f"cust:{cust}/agent", c["agent"])]
    follow = [steps[0], StepSpec(f"{q}.f.plan", "derive", key=f"sla:{cust}/plan_hours", fn="map", inputs=(f"cust:{cust}/plan",), template=hours, cache=True),
              StepSpec(f"{q}.f.answer", "answer", inputs=(f"cust:{cust}/email", f"cust:{cust}/agent", f"sla:{cust}/plan_hours"), template="{0}; {1}; {2} h")]
    return steps + [answer], prior_keys, {"follow": follow, "cust": cust, "ticket": ticket, "email": email}


def _airline_subdb(users: list[str]) -> dict:
    from lab.provenance.tasks import airline_db

    src = airline_db()
    res = {r for u in users for r in src["users"][u]["reservations"]}
    flights = {src["reservations"][r]["flights"][0]["flight_number"] for r in res}
    return {
        "users": {u: copy.deepcopy(src["users"][u]) for u in users},
        "reservations": {r: copy.deepcopy(src["reservations"][r]) for r in res},
        "flights": {f: copy.deepcopy(src["flights"][f]) for f in flights},
        "forum": {},
        "ledger": {u: {"id": u} for u in users},
    }


def make_case(domain: str, failure: str, idx: int, seed: int = 0, knobs: GeneratorKnobs = GeneratorKnobs()) -> Case:
    """Case ``idx`` of ``domain`` x ``failure`` for generator ``seed`` (deterministic)."""
    rng = random.Random(f"repair/{seed}/{domain}/{failure}/{idx}")
    run = f"{domain}/{failure}/{seed}-{idx}"
    n = 1 + knobs.n_other
    main = rng.randrange(n)
    if domain == "airline":
        from lab.provenance.tasks import airline_db

        src = airline_db()
        cands = sorted(u for u, v in src["users"].items() if v["reservations"] and any(k.startswith("credit_card") for k in v["payment_methods"]))
        users = rng.sample(cands, n + 3)
        db = _airline_subdb(users)
        ents = [(u, rng.choice(db["users"][u]["reservations"])) for u in users[:n]]
        reqs = [_airline_request(f"q{j}", db, u, r) for j, (u, r) in enumerate(ents)]
        make = lambda d: airline_env(d)  # noqa: E731
    elif domain == "shop":
        db = shop_db(seed * 1000 + idx)
        custs = rng.sample(sorted(db["customers"]), n + 3)
        reqs = []
        for j, c in enumerate(custs[:n]):
            order = rng.choice(sorted(o for o, v in db["orders"].items() if v["customer"] == c))
            p2 = rng.choice(sorted(p for p in db["products"] if p != db["orders"][order]["product"]))
            reqs.append(_shop_request(f"q{j}", db, c, order, p2))
        make = lambda d: shop_env(db=d)  # noqa: E731
    else:
        db = support_db(seed * 1000 + idx)
        custs = rng.sample(sorted(db["customers"]), n + 3)
        reqs = []
        for j, c in enumerate(custs[:n]):
            ticket = rng.choice(sorted(t for t, v in db["tickets"].items() if v["customer"] == c))
            reqs.append(_support_request(f"q{j}", db, c, ticket, email=(j == main and rng.random() < knobs.p_email)))
        make = lambda d: support_env(db=d)  # noqa: E731
    others = custs[n:] if domain != "airline" else users[n:]
    steps: list[StepSpec] = []
    for j, (s, _, _) in enumerate(reqs):
        steps += [x for x in s if x.kind != "answer" or j == main]
    answer = next(x for x in steps if x.kind == "answer")
    steps = [x for x in steps if x.kind != "answer"] + [answer]
    main_steps, prior_keys, info = reqs[main]
    program = Program(run, domain, tuple(steps), tuple(info["follow"]))
    clean_db, bad_db = copy.deepcopy(db), copy.deepcopy(db)
    clean_store, bad_store = MemTXMemory(), MemTXMemory()
    # prior-session memory: every request's cached customer keys (true values), plus unrelated records; written
    # once the fault is known (a stale / misattributed / derived fault is a prior record with the wrong value)
    prior: list[tuple[str, Any, int]] = []
    t = -100
    for j, (_, pk, _) in enumerate(reqs):
        for key, value in pk:
            prior.append((key, value, t))
            t += 1
    for k in range(knobs.n_prior_unrelated):
        o = others[k % len(others)]
        key, value = f"note:{o}/preference{k}", rng.choice(["window seat", "no calls before 10", "email only", "express shipping", "weekend delivery"])
        prior.append((key, value, t))
        t += 1
    faulty: dict[str, str] = {}
    q = f"q{main}"
    wrong = _wrong_value(domain, failure, db, info, rng)
    meta = {"main": q, "wrong": wrong}
    if failure == "poisoned":
        topic, field_name, store_step = {"airline": (f"bags/{info.get('res')}", "free_bags", "forum"), "shop": (info.get("product"), "price", "reviews"), "support": (None, "fix", "forum")}[domain]
        if domain == "support":
            topic = db["kb"][db["tickets"][info["ticket"]]["article"]]["topic"]
        table = {"airline": "forum", "shop": "reviews", "support": "forum"}[domain]
        bad_db[table][f"post{idx}"] = {"topic": topic, field_name: wrong, "author": f"user{rng.randrange(100, 999)}"}
        faulty[f"{run}/{q}.{store_step}/m0"] = "poisoned"
    else:
        key = {("airline", "stale"): "user:{user}/payment_id", ("airline", "misattributed"): "user:{user}/payment_id", ("airline", "derived"): "user:{user}/membership",
               ("shop", "stale"): "cust:{cust}/address", ("shop", "misattributed"): "cust:{cust}/card", ("shop", "derived"): "cust:{cust}/tier",
               ("support", "stale"): "cust:{cust}/agent", ("support", "misattributed"): "cust:{cust}/email", ("support", "derived"): "cust:{cust}/plan"}[(domain, failure)].format(**info)
        rid = f"prior/{key}"
        faulty[rid] = failure
        meta["key"] = key
    bad_key = meta.get("key")
    for key, value, t in prior:
        clean_store.write(MemoryRecord(f"prior/{key}", key, value, t, 1.0, "prior"))
        bad_store.write(MemoryRecord(f"prior/{key}", key, wrong if key == bad_key else value, t, 1.0, "prior"))
    return Case(run, domain, failure, program, make(bad_db), bad_store, make(clean_db), clean_store, faulty, meta)


def _wrong_value(domain: str, failure: str, db: dict, info: dict, rng: random.Random) -> Any:
    """The planted / stale / misattributed value (a real-looking one of the domain)."""
    if domain == "airline":
        u = db["users"][info["user"]]
        if failure == "poisoned":
            return rng.choice([4, 5])
        if failure == "derived":
            return rng.choice([m for m in ("regular", "silver", "gold") if m != u["membership"]])
        if failure == "stale":
            return f"credit_card_{rng.randrange(1000000, 9999999)}"
        other = next(v for k, v in db["users"].items() if k != info["user"])
        return next(iter(other["payment_methods"]))
    if domain == "shop":
        c = db["customers"][info["cust"]]
        if failure == "poisoned":
            return db["orders"][info["order"]]["total"]  # "costs the same as what you paid"
        if failure == "derived":
            return rng.choice([t for t in ("silver", "gold", "platinum") if t != c["tier"]])
        if failure == "stale":
            return f"{rng.randrange(10, 999)} Old Mill Road, {c['address'].split(', ')[-1]}"
        other = next(v for k, v in sorted(db["customers"].items()) if k != info["cust"])
        return other["default_card"]
    c = db["customers"][info["cust"]]
    if failure == "poisoned":
        cur = db["kb"][db["tickets"][info["ticket"]]["article"]]["fix"]
        return rng.choice(["disable the firewall", "firmware 1.0.0-beta", "factory reset"] if cur != "factory reset" else ["disable the firewall", "firmware 1.0.0-beta"])
    if failure == "derived":
        return rng.choice([p for p in ("basic", "pro", "enterprise") if p != c["plan"]])
    if failure == "stale":
        return f"AG{rng.randrange(60, 99)}"
    other = next(v for k, v in sorted(db["customers"].items()) if k != info["cust"])
    return other["email"]


def generate_cases(n: int = 150, seed: int = 0, knobs: GeneratorKnobs = GeneratorKnobs()) -> list[Case]:
    """``n`` cases cycling over :data:`~lab.provenance.repair.envs.DOMAINS` x :data:`FAILURES` (150: 12 or 13
    of each pair). ``seed=0`` is the test set; the planner's rules are chosen on ``seed=1``."""
    return [make_case(DOMAINS[i % 3], FAILURES[(i // 3) % 4], i, seed, knobs) for i in range(n)]
