# Reference solution: replaces the cell tagged "exercise" in notebooks/04_memory_transactions.ipynb.
types = {rid: typ for rid, typ, _ in ex_records}
children = {rid: [c for c, _, ps in ex_records if rid in ps] for rid, _, _ in ex_records}
descendants, todo = [], ["root"]
while todo:
    for c in children[todo.pop()]:
        if c not in descendants:
            descendants.append(c)
            todo.append(c)
answer = {d: "quarantined" if types[d] in ("summary", "profile", "index_entry", "shared_copy") else "revoked" for d in descendants}
answer
