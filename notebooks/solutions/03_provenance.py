# Reference solution: replaces the cell tagged "exercise" in notebooks/03_provenance.ipynb.
def own_factor(node_id):
    """f(n): the node's own trust, or 0 once it is invalid or revoked."""
    node = graph.node(node_id)
    if not node.valid or node.attributes.get("revoked", False):
        return 0.0
    return node.trust


def my_path_trust(node_id):
    """tau(n) = f(n) for a root, else f(n) * the best path trust among its lineage parents."""
    parents = graph.parents(node_id)
    if not parents:
        return own_factor(node_id)
    return own_factor(node_id) * max(my_path_trust(p) for p in parents)


answer = {i: my_path_trust(i) for i in exercise_records}
{i.removeprefix(run + "/"): round(t, 3) for i, t in answer.items()}
