"""The ProvenanceExplorer drawing a rollback repair, in Voila with a real Chromium (issue #20).

A Voila page repairs one real tau-bench run (the stress case of notebook 04b) with the paper-faithful planner,
whose plan keeps two claims through support paths, and shows it with ``ProvenanceExplorer(graph,
repair=repair_overlay(result))``. The test checks what cytoscape draws against what Python computed: every
node, the deactivated records faded (opacity 0.3), the replayed steps with the purple border, the support
path's nodes with the green underlay and its edges green, and the legend's three repair entries with their
counts. Any page error or request leaving 127.0.0.1 fails it; the screenshot is
``test-artifacts/rollback_repair_explorer.png``.
"""

from __future__ import annotations

import pytest

from tests.browser import ARTIFACTS, CHROMIUM_ARGS, ROOT, NetworkWatch, PageWatch, chromium, voila_server

REPAIR_CODE = """
from lab.provenance.repair import PAPER, repair
from lab.provenance.repair.evaluate import run_failed
from lab.provenance.repair.taubench import stress_cases
from lab.provenance.repair.view import repair_overlay, to_provenance_graph

case = next(c for c in stress_cases(50, seed=0) if c.id == "tau-airline/task10/trial2/poisoned")
failed = run_failed(case)
env, store = failed.env.copy(), failed.store.copy()
result = repair(case.program, failed.trace, store, env, dict(case.faulty), PAPER)
graph, overlay = to_provenance_graph(result), repair_overlay(result)
"""
CY = "document.querySelector('.lab-pe-cy').closest('.lab-pe').parentElement.__cy"


def _notebook(path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# A repair in the explorer"),
        nbformat.v4.new_code_cell(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n{REPAIR_CODE}\nfrom widgets import ProvenanceExplorer\nProvenanceExplorer(graph, repair=overlay)"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.mark.browser
@pytest.mark.slow
def test_voila_explorer_draws_the_repair(tmp_path):
    from playwright.sync_api import sync_playwright

    from lab.provenance.repair.view import apply_repair
    from lab.provenance.view import explorer_elements, legend

    scope: dict = {}
    exec(REPAIR_CODE, scope)
    els = apply_repair(explorer_elements(scope["graph"]), scope["overlay"])
    marks = {n["data"]["id"]: set(n["data"].get("marks", [])) for n in els["nodes"]}
    faded = sorted(k for k, v in marks.items() if "repair_deactivated" in v)
    replayed = sorted(k for k, v in marks.items() if "repair_replayed" in v)
    support = sorted(k for k, v in marks.items() if "repair_support" in v)
    path_edges = sorted(e["data"]["id"] for e in els["edges"] if e["data"].get("marks"))
    assert faded and replayed and support and path_edges
    want_legend = {e["key"]: e["count"] for e in legend(els) if e["key"].startswith("repair_")}

    executable = chromium()
    notebook = _notebook(tmp_path / "repair.ipynb")
    with voila_server(notebook, tmp_path / "voila.log") as port, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            watch = PageWatch(page, "rollback_repair_explorer")
            net = NetworkWatch(page, "rollback_repair_explorer", voila=True)
            page.goto(f"http://127.0.0.1:{port}/", timeout=300_000)
            n = len(els["nodes"])
            watch.wait_for(f"(n) => {{ const cy = {CY}; return cy && cy.nodes().length === n; }}", arg=n, what=f"the repaired run's {n} nodes", timeout_s=300)
            drawn = page.evaluate(
                f"""(a) => {{ const cy = {CY};
                  const st = (ids, p) => ids.map(i => cy.$id(i).style(p));
                  return {{ids: cy.nodes().map(x => x.id()).sort(), faded: st(a.faded, 'opacity'), replayed: st(a.replayed, 'border-color'),
                          support: st(a.support, 'underlay-color'), edges: a.edges.map(i => cy.$id(i).style('line-color')),
                          other: cy.nodes().filter(x => !x.hasClass('repair_deactivated')).map(x => x.style('opacity'))}}; }}""",
                {"faded": faded, "replayed": replayed, "support": support, "edges": path_edges},
            )
            assert drawn["ids"] == sorted(marks)
            assert set(drawn["faded"]) == {"0.3"}, drawn["faded"]
            assert set(drawn["replayed"]) == {"rgb(123,47,190)"}, drawn["replayed"]
            assert set(drawn["support"]) == {"rgb(0,166,81)"}, drawn["support"]
            assert set(drawn["edges"]) == {"rgb(0,166,81)"}, drawn["edges"]
            assert set(drawn["other"]) == {"1"}
            rows = page.evaluate(
                "() => Array.from(document.querySelectorAll('.lab-pe-legend-entry')).filter(e => e.dataset.key.startsWith('repair_'))"
                ".map(e => [e.dataset.key, e.querySelector('.n').innerText])"
            )
            assert {k: int(v.split("/")[1]) for k, v in rows} == want_legend
            page.locator(".lab-pe-cy").scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "rollback_repair_explorer.png"))
            assert not watch.page_errors, watch.page_errors
            net.check()
        finally:
            browser.close()
