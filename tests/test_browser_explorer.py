"""End to end: Voila serves a notebook with a ProvenanceExplorer; a real click in Chromium reaches Python.

A tiny notebook (written into ``tmp_path``) builds a small provenance graph and shows the
explorer beside an ipywidgets ``Label`` that a Python observer sets to ``selected``. Chromium
clicks a node on the cytoscape canvas with a real mouse click; the Label must then show the
node's id (the click went browser -> Python) and the node's ancestors must carry the highlight
class (Python's neighbourhood went back to the browser). Fails, never skips, without Chromium.
"""

from __future__ import annotations

import pytest

from tests.browser import ARTIFACTS, CHROMIUM_ARGS, ROOT, PageWatch, chromium, voila_notebook, voila_server


NOTEBOOK_CODE = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
import ipywidgets as W
from lab.provenance import Edge, Node, ProvenanceGraph
from widgets.provenance_explorer import ProvenanceExplorer

g = ProvenanceGraph()
g.add_nodes([
    Node(id="alice", type="agent", time=0.0),
    Node(id="bob", type="agent", time=0.0),
    Node(id="s1", type="source", text="bank statement", trust=0.9, labels=frozenset({{"finance"}}), owner="alice", time=1.0),
    Node(id="s2", type="source", text="web page", trust=0.5, owner="alice", time=2.0),
    Node(id="m1", type="memory", text="balance summary", trust=0.8, owner="alice", time=3.0),
    Node(id="c1", type="claim", text="can afford", trust=0.5, owner="alice", time=4.0),
    Node(id="x1", type="action", text="book flight", owner="alice", time=5.0),
])
g.add_edges([
    Edge(src="m1", dst="s1", relation="derived_from"),
    Edge(src="c1", dst="m1", relation="derived_from"),
    Edge(src="s2", dst="c1", relation="supports"),
    Edge(src="c1", dst="x1", relation="supports"),
    Edge(src="x1", dst="alice", relation="attributed_to"),
])
explorer = ProvenanceExplorer(g, agent="bob")
label = W.Label(value="(nothing selected)")
label.add_class("lab-selected-label")
explorer.observe(lambda change: setattr(label, "value", "selected: " + change["new"]), names="selected")
W.VBox([label, explorer])
"""



@pytest.mark.browser
@pytest.mark.slow
def test_click_on_a_node_reaches_python_and_highlights_its_lineage(tmp_path):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    notebook = voila_notebook(NOTEBOOK_CODE, tmp_path / "explorer.ipynb")

    with voila_server(notebook, tmp_path / "voila.log") as port, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            watch = PageWatch(page, "provenance_explorer_click")
            page.goto(f"http://127.0.0.1:{port}/", timeout=300_000)
            watch.wait_for(page.locator(".lab-pe-cy canvas"), what="the explorer's canvas", timeout_s=300)
            watch.wait_for(
                "() => { const el = document.querySelector('.lab-pe-cy').closest('.lab-pe').parentElement;"
                " return el.__cy && el.__cy.nodes().length === 7 && el.__cy.container().clientWidth > 0; }",
                what="the graph's 7 nodes, laid out",
            )
            page.locator(".lab-pe-cy").scroll_into_view_if_needed()
            page.wait_for_timeout(500)  # let the layout's fit settle
            # viewport coordinates of m1 (ancestor s1; descendants c1, x1), from cytoscape's rendered position
            x, y = page.evaluate(
                """() => { const el = document.querySelector('.lab-pe-cy').closest('.lab-pe').parentElement;
                   const cy = el.__cy; const p = cy.$id('m1').renderedPosition();
                   const r = cy.container().getBoundingClientRect(); return [r.left + p.x, r.top + p.y]; }"""
            )
            # the greyed-out node for bob carries its reason
            assert "missing label 'finance'" in page.evaluate(
                "() => document.querySelector('.lab-pe-cy').closest('.lab-pe').parentElement.__cy.$id('m1').data('reason')"
            )
            page.mouse.click(x, y)
            watch.wait_for(
                "() => document.querySelector('.lab-selected-label').innerText.includes('selected: m1')",
                what="the Python-side label to say 'selected: m1'",
            )
            watch.wait_for(
                """() => { const cy = document.querySelector('.lab-pe-cy').closest('.lab-pe').parentElement.__cy;
                   return cy.$id('s1').hasClass('ancestor') && cy.$id('x1').hasClass('descendant') && cy.$id('m1').hasClass('focus'); }""",
                what="m1's lineage highlighted",
            )
            watch.wait_for(
                "() => document.querySelector('.lab-pe-detail').innerText.includes('balance summary')", what="m1's details"
            )
            classes = page.evaluate(
                "() => { const cy = document.querySelector('.lab-pe-cy').closest('.lab-pe').parentElement.__cy;"
                " return Object.fromEntries(cy.nodes().map(n => [n.id(), n.classes()])); }"
            )
            assert "ineligible" in classes["m1"] and "ineligible" not in classes["s2"]
            assert "ancestor" in classes["s1"] and "descendant" in classes["c1"] and "faded" in classes["bob"]
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "provenance_explorer_click.png"))
            assert not watch.page_errors, watch.page_errors
        finally:
            browser.close()
