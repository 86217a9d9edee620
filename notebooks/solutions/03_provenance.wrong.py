# expect: revoked or invalid   (the check's message must say this: it recognised the mistake)
# A plausible wrong attempt (the check must reject it): the recursion is right, but each node's factor is its
# trust field alone, so the revoked flight search (and everything resting only on it) keeps trust 1.
def my_path_trust(node_id):
    parents = graph.parents(node_id)
    own = graph.node(node_id).trust
    if not parents:
        return own
    return own * max(my_path_trust(p) for p in parents)


answer = {i: my_path_trust(i) for i in exercise_records}
{i.removeprefix(run + "/"): round(t, 3) for i, t in answer.items()}
