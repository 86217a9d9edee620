# expect: quarantined, not revoked   (the check's message must say this: it recognised the mistake)
# A plausible wrong attempt (the check must reject it): every descendant is revoked, as if the cascade had one rule.
children = {rid: [c for c, _, ps in ex_records if rid in ps] for rid, _, _ in ex_records}
descendants, todo = [], ["root"]
while todo:
    for c in children[todo.pop()]:
        if c not in descendants:
            descendants.append(c)
            todo.append(c)
answer = {d: "revoked" for d in descendants}
