"""The ProvenanceExplorer mirroring a MemTX store, in Voila with a real Chromium (issue #19).

A Voila page runs notebook 04's own cells (the polluted-tool-result case on the embedded SQLite store: the bad
write, the gate's refusal, the commit, the reversible hold and the retraction's cascade) up to
``ProvenanceExplorer(graph, memtx=store)``, below a tall spacer so the explorer sits at a scrolled position. The
test runs the same cells here and checks what cytoscape draws against what Python computed: every record's node
with a label that leads with its lifecycle state (``[revoked]`` belief, ``[quarantined]`` summary,
``[compensated]`` hold), the quarantined summary and the revoked belief faded (see-through fill, grey label) with their own border colours
(:data:`lab.provenance.txn.view.LIFECYCLE_ENCODING`), the compensated action's double blue border, and the
legend's lifecycle entries with their counts. It then clicks the summary's node where it is drawn on the scrolled
page and checks that the details panel names that record. Any page error or request leaving 127.0.0.1 fails it;
the screenshots are ``test-artifacts/memtx_explorer.png`` (nothing selected) and ``memtx_explorer_selected.png``
(after the click).
"""

from __future__ import annotations

import json

import pytest

from tests.browser import ARTIFACTS, CHROMIUM_ARGS, ROOT, NetworkWatch, PageWatch, chromium, voila_server

NOTEBOOK = ROOT / "notebooks" / "04_memory_transactions.ipynb"
CY = "document.querySelector('.lab-pe-cy').closest('.lab-pe').parentElement.__cy"


def _case_cells() -> list[str]:
    """Notebook 04's code cells up to (and including) the one that shows the explorer."""
    cells = []
    for c in json.loads(NOTEBOOK.read_text())["cells"]:
        if c["cell_type"] == "code":
            cells.append("".join(c["source"]))
            if "ProvenanceExplorer(" in cells[-1]:
                return cells
    raise AssertionError(f"{NOTEBOOK.name} has no cell showing ProvenanceExplorer")


def _notebook(path, cells):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"import sys\nsys.path.insert(0, {str(ROOT)!r})")]
    nb.cells += [nbformat.v4.new_code_cell(c) for c in cells[:-1]]
    nb.cells.append(nbformat.v4.new_markdown_cell("# The store in the explorer\n\n" + "spacer line so the page scrolls  \n" * 60))
    nb.cells.append(nbformat.v4.new_code_cell(cells[-1]))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.mark.browser
@pytest.mark.slow
def test_voila_explorer_draws_the_memtx_lifecycle(tmp_path):
    from playwright.sync_api import sync_playwright

    from lab.provenance.txn.view import LIFECYCLE_ENCODING

    cells = _case_cells()
    scope: dict = {}
    for c in cells:
        exec(c, scope)
    els = scope["explorer"].elements
    states = scope["store"].states()
    data = {n["data"]["id"]: n["data"] for n in els["nodes"]}
    assert set(data) == set(states), (sorted(data), sorted(states))
    action = next(i for i in data if i.startswith("act-"))
    assert {k: states[k].value for k in ("b-refundable", "s-case", action)} == {"b-refundable": "revoked", "s-case": "quarantined", action: "revoked"}
    want_legend = {e["key"]: e["count"] for e in scope["explorer"].legend if e["key"] in LIFECYCLE_ENCODING}
    assert want_legend == {"lifecycle_quarantined": 1, "lifecycle_revoked": 2, "effect_compensated": 1}, want_legend

    executable = chromium()
    notebook = _notebook(tmp_path / "memtx.ipynb", cells)
    with voila_server(notebook, tmp_path / "voila.log") as port, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            watch = PageWatch(page, "memtx_explorer")
            net = NetworkWatch(page, "memtx_explorer", voila=True)
            page.goto(f"http://127.0.0.1:{port}/", timeout=120_000)
            n = len(data)
            watch.wait_for(f"(n) => {{ const cy = {CY}; return cy && cy.nodes().length === n; }}", arg=n, what=f"the store's {n} records", timeout_s=120)
            drawn = page.evaluate(
                f"""() => {{ const cy = {CY};
                  return Object.fromEntries(cy.nodes().map(x => [x.id(), {{label: x.data('label'), fill: x.style('background-opacity'), text: x.style('text-opacity'),
                    border: x.style('border-color'), border_opacity: x.style('border-opacity'), style: x.style('border-style'), classes: x.classes()}}]));
                }}"""
            )
            # the action's id is random per run (the page's kernel ran the case itself): match it by its prefix
            page_action = next(i for i in drawn if i.startswith("act-"))
            assert sorted({*drawn} - {page_action}) == sorted({*data} - {action}) and len(drawn) == len(data), (sorted(drawn), sorted(data))
            drawn[action] = drawn.pop(page_action)
            for rid, state in (("b-refundable", "revoked"), ("s-case", "quarantined"), (action, "compensated")):
                assert drawn[rid]["label"].startswith(f"[{state}]"), (rid, drawn[rid]["label"])
            # faded, each inactive state in its own colour (quarantined orange, revoked black)
            assert (drawn["s-case"]["fill"], drawn["s-case"]["text"]) == ("0.3", "0.6") and "lifecycle_quarantined" in drawn["s-case"]["classes"], drawn["s-case"]
            assert drawn["s-case"]["border"] == "rgb(230,159,0)" and drawn["s-case"]["style"] == "dashed", drawn["s-case"]
            assert drawn["b-refundable"]["fill"] == "0.3" and drawn["b-refundable"]["border"] == "rgb(0,0,0)", drawn["b-refundable"]
            assert drawn[action]["border"] == "rgb(31,119,180)" and drawn[action]["style"] == "double" and drawn[action]["border_opacity"] == "1", drawn[action]
            assert drawn[action]["label"] == "[compensated] hold_seat\nreservation=4WQ150", drawn[action]["label"]
            rows = page.evaluate(
                "() => Array.from(document.querySelectorAll('.lab-pe-legend-entry')).map(e => [e.dataset.key, e.innerText, e.querySelector('.n').innerText])"
            )
            legend = {k: (text, int(c.split("/")[1])) for k, text, c in rows}
            assert {k: v[1] for k, v in legend.items() if k in LIFECYCLE_ENCODING} == want_legend
            assert "quarantined" in legend["lifecycle_quarantined"][0] and "revoked" in legend["lifecycle_revoked"][0], legend
            assert "compensated" in legend["effect_compensated"][0], legend

            page.evaluate("() => document.querySelector('.lab-pe').scrollIntoView({block: 'start'})")
            page.wait_for_timeout(300)
            page.screenshot(path=str(ARTIFACTS / "memtx_explorer.png"))  # nothing selected: the lifecycle marks as drawn

            # click the quarantined summary where it is drawn, with the page scrolled down to the explorer
            scrolled = page.evaluate("() => window.scrollY || document.scrollingElement.scrollTop || Math.max(...Array.from(document.querySelectorAll('*')).map(e => e.scrollTop))")
            assert scrolled > 0, "the explorer should sit below the fold"
            box = page.locator(".lab-pe-cy").bounding_box()
            at = page.evaluate(f"() => {CY}.$id('s-case').renderedPosition()")
            page.mouse.click(box["x"] + at["x"], box["y"] + at["y"])
            watch.wait_for("() => (document.querySelector('.lab-pe-detail-title') || {}).innerText === 's-case'", what="the details of s-case after the click", timeout_s=20)
            detail = page.locator(".lab-pe-detail").inner_text()
            assert "[quarantined] summary reservation:4WQ150.case_summary" in detail, detail
            page.mouse.move(box["x"] + 5, box["y"] + 5)  # off the node, so its hover tip does not cover the labels
            page.evaluate("() => document.querySelector('.lab-pe').scrollIntoView({block: 'start'})")
            page.wait_for_timeout(300)
            page.screenshot(path=str(ARTIFACTS / "memtx_explorer_selected.png"))
            assert not watch.page_errors, watch.page_errors
            net.check()
        finally:
            browser.close()


def test_lifecycle_marks_tell_the_inactive_states_and_effects_apart(tmp_path):
    """Superseded, quarantined and revoked records and a leaked action each carry their own mark (which the
    explorer styles and the legend names); active records carry none (the browser test above checks the drawing)."""
    from lab.provenance.graph import ProvenanceGraph
    from lab.provenance.txn import MemTXStore, Tier
    from lab.provenance.txn.view import LIFECYCLE_ENCODING, lifecycle_elements
    from tests.memtx_support import rec

    store = MemTXStore(":memory:")
    store.register_tool("refund", irreversible=True, run=lambda a: None)
    for r in (rec("old", val="open", auth=0.6), rec("new", val="closed", auth=0.9, src="ledger"), rec("root", ent="e", attr="x"),
              rec("sum", ent="e", attr="s", typ="summary", parents=["root"]), rec("kept", ent="f", attr="y")):
        tx = store.begin("a", tier=Tier.EXTERNAL_ACTION)
        tx.stage(r)
        assert tx.commit().committed, r["id"]
    act = store.begin("a", tier=Tier.EXTERNAL_ACTION).call_tool("refund", {"reservation_id": "R1", "amount": 5}, uses=["sum"]).action
    store.retract("root")
    with ProvenanceGraph(tmp_path / "g.db") as graph:
        els = lifecycle_elements(store, graph)
    marks = {n["data"]["id"]: [m for m in n["data"]["marks"] if m in LIFECYCLE_ENCODING] for n in els["nodes"]}
    assert marks == {"old": ["lifecycle_superseded"], "new": [], "root": ["lifecycle_revoked"], "sum": ["lifecycle_quarantined"], "kept": [],
                     act: ["lifecycle_revoked", "effect_leaked"]}, marks
    label = next(n["data"]["label"] for n in els["nodes"] if n["data"]["id"] == act)
    assert label == "[LEAKED irreversible] refund\nreservation_id=R1, amount=5", label
    styles = {k: (v["style"].get("border-color"), v["border"]) for k, v in LIFECYCLE_ENCODING.items()}
    assert len({c for c, _ in styles.values()}) == len(styles)  # no two marks drawn alike
