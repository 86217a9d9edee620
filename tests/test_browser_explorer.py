"""End to end: the ProvenanceExplorer in Voila and in JupyterLab, driven by a real Chromium as a user would.

Voila serves a small notebook (written into ``tmp_path``): lesson text above and below, then a
provenance graph shown in the explorer beside an ipywidgets ``Label`` that a Python observer sets to
``selected``. JupyterLab (``make lab`` on a copy of ``notebooks/``) runs ``03_provenance.ipynb`` with
Run All, which leaves the notebook scrolled to its end, far below the explorer.

On both pages the test checks what is drawn, not just that a div exists: cytoscape holds exactly the
run's nodes; after the page has scrolled (the mouse having moved while the explorer was elsewhere, so
that cytoscape read its container's offset there), a node clicked at its real on-screen position (its
``renderedPosition`` plus the container's ``getBoundingClientRect()`` at that moment) shows in the
detail panel, and a hovered one in the tooltip; unticking a type hides exactly the nodes Python's
``lab.provenance.view.visible_ids`` leaves out, and a hidden node answers neither a hover nor a click.
In JupyterLab, re-running the explorer's cell removes the old view's ``window.__labExplorers`` entry.

The panels around the graph are checked against what Python computed for the same elements
(:func:`check_panels`): the legend lists exactly the node types drawn, each swatch in the shape and colour
cytoscape draws that type with, and a border entry for each mark some drawn node carries; typing in the
search box marks exactly Python's hits in the graph (counted in cytoscape) and Enter selects the first;
the timeline has one row per node, in Python's order, each bar's left edge and width the fraction of the
axis Python computed from the timings; a click on a timeline row selects its node in the graph and a
click on a node selects its row; a node's open tooltip closes when a filter hides it (the mouse not
moving), and its row hides with it; the time slider's reading carries the unit (seconds in Voila,
message indices for the tau-bench run in JupyterLab) and hides what Python's rule hides.
Any page error, console error or request leaving 127.0.0.1 fails the test (:class:`tests.browser.NetworkWatch`).
Screenshots go to ``test-artifacts/provenance_explorer_*.png``. Fails, never skips, without Chromium.
"""

from __future__ import annotations

import json
import secrets
import shutil

import pytest

from tests.browser import (
    ARTIFACTS,
    CHROMIUM_ARGS,
    KERNEL_IDLE_JS,
    ROOT,
    NetworkWatch,
    PageWatch,
    chromium,
    make_server,
    run_all_cells,
    voila_server,
)

# The Voila page's graph; the test builds the same one to compute what Python shows for it.
GRAPH_CODE = """
from lab.provenance import Edge, Node, ProvenanceGraph

g = ProvenanceGraph()
g.add_nodes([
    Node(id="alice", type="agent", time=0.0),
    Node(id="bob", type="agent", time=0.0),
    Node(id="s1", type="source", text="bank statement", trust=0.9, labels=frozenset({"finance"}), owner="alice", time=1.0),
    Node(id="s2", type="source", text="web page", trust=0.5, owner="alice", time=2.0),
    Node(id="m1", type="memory", text="balance summary", trust=0.8, owner="alice", time=4.0),
    Node(id="c1", type="claim", text="can afford", trust=0.5, owner="alice", time=7.0),
    Node(id="x1", type="action", text='book_flight({"flight_number": "HAT271", "cabin": "economy"})', owner="alice", time=8.0,
         attributes={"tool": "book_flight", "arguments": {"flight_number": "HAT271", "cabin": "economy"}}),
    Node(id="r1", type="source", text='{"reservation_id": "ZFA04Y", "flight_number": "HAT271"}', owner="alice", time=11.0,
         attributes={"tool": "book_flight", "arguments": {"flight_number": "HAT271", "cabin": "economy"}}),
])
g.add_edges([
    Edge(src="m1", dst="s1", relation="derived_from"),
    Edge(src="c1", dst="m1", relation="derived_from"),
    Edge(src="s2", dst="c1", relation="supports"),
    Edge(src="c1", dst="x1", relation="supports"),
    Edge(src="x1", dst="alice", relation="attributed_to"),
    Edge(src="x1", dst="r1", relation="generated"),
])
"""
NOTEBOOK_CODE = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
import ipywidgets as W
from widgets.provenance_explorer import ProvenanceExplorer
{GRAPH_CODE}
explorer = ProvenanceExplorer(g, agent="bob")
label = W.Label(value="(nothing selected)")
label.add_class("lab-selected-label")
explorer.observe(lambda change: setattr(label, "value", "selected: " + change["new"]), names="selected")
W.VBox([label, explorer])
"""
VOILA_IDS = {"alice", "bob", "s1", "s2", "m1", "c1", "x1", "r1"}
LESSON = "\n\n".join(["A paragraph of the lesson around the explorer, long enough to make the page scroll. " * 6] * 8)

# The explorer's cytoscape instance (one explorer per page) and the container it draws in.
CY = "document.querySelector('.lab-pe-cy').closest('.lab-pe').parentElement.__cy"

# Scroll the explorer's nearest scrolling ancestor (JupyterLab: the notebook's panel; Voila: the page).
SCROLLER_JS = """() => { let e = document.querySelector('.lab-pe').parentElement;
  while (e && e !== document.body && e !== document.documentElement) {
    const s = getComputedStyle(e);
    if (/(auto|scroll)/.test(s.overflowY) && e.scrollHeight > e.clientHeight + 1) return e;
    e = e.parentElement; }
  return document.scrollingElement; }"""
# The part of the window where the explorer's canvas can be seen (and clicked) now: the container's
# bounding rectangle, clipped by its scrolling ancestor and the window, less a margin.
SEEN_JS = f"""() => {{ const cy = {CY}; const r = cy.container().getBoundingClientRect(); const e = ({SCROLLER_JS})();
  const s = e === document.scrollingElement ? {{left: 0, top: 0, right: innerWidth, bottom: innerHeight}} : e.getBoundingClientRect();
  const m = 20; return {{r, left: Math.max(r.left, s.left, 0) + m, top: Math.max(r.top, s.top, 0) + m,
    right: Math.min(r.right, s.right, innerWidth) - m, bottom: Math.min(r.bottom, s.bottom, innerHeight) - m}}; }}"""

# Viewport coordinates of node `id` now, from cytoscape's rendered position plus the container's
# bounding rectangle at this moment, and whether that point can be seen (see SEEN_JS).
NODE_AT_JS = f"""(id) => {{ const cy = {CY}; const p = cy.$id(id).renderedPosition(); const v = ({SEEN_JS})();
  const x = v.r.left + p.x, y = v.r.top + p.y;
  return {{x, y, inside: x > v.left && x < v.right && y > v.top && y < v.bottom}}; }}"""

# Among `ids` (null: every visible node), the one that can be seen and lies farthest from every other
# visible node (so that a click at its centre cannot land on a neighbour); null if none can be seen.
PICK_JS = f"""(ids) => {{ const cy = {CY}; const v = ({SEEN_JS})();
  const shown = cy.nodes().filter(n => !n.hasClass('hidden'));
  const pool = ids ? cy.nodes().filter(n => ids.includes(n.id())) : shown;
  let best = null, bestD = -1;
  pool.forEach(n => {{ const p = n.renderedPosition(); const x = v.r.left + p.x, y = v.r.top + p.y;
    if (!(x > v.left && x < v.right && y > v.top && y < v.bottom)) return;
    let d = Infinity;
    shown.forEach(o => {{ if (o.id() !== n.id()) {{ const q = o.renderedPosition();
      d = Math.min(d, Math.hypot(q.x - p.x, q.y - p.y)); }} }});
    if (d > bestD) {{ bestD = d; best = n.id(); }} }});
  return best; }}"""

SCROLL_TO_END_JS = f"""(end) => {{ const e = ({SCROLLER_JS})(); const box = document.querySelector('.lab-pe-cy');
  const before = box.getBoundingClientRect().top;
  e.scrollTop = end === 'top' ? 0 : e.scrollHeight; return [before, box.getBoundingClientRect().top]; }}"""
SCROLL_BY_JS = f"""(dy) => {{ const e = ({SCROLLER_JS})(); const s = e.scrollTop; e.scrollTop = s + dy; return e.scrollTop - s; }}"""
CENTER_JS = """() => { document.querySelector('.lab-pe-cy').scrollIntoView({block: 'center'});
  return document.querySelector('.lab-pe-cy').getBoundingClientRect().top; }"""
# cytoscape's cached container offset (what its pointer events use) beside the real one, for failure messages
OFFSETS_JS = f"""() => {{ const cy = {CY}; const bb = cy.renderer().containerBB;
  return {{cached_top: bb ? bb[1] : null, real_top: cy.container().getBoundingClientRect().top}}; }}"""
DETAIL_JS = "() => document.querySelector('.lab-pe-detail').innerText"
TIP_JS = "() => { const t = document.querySelector('.lab-pe-tip'); return t.style.display === 'block' ? t.innerText : ''; }"
# every node id the detail panel has shown so far (a click on a hidden node must never put one there)
RECORD_DETAILS_JS = """() => { window.__labDetailTitles = [];
  const box = document.querySelector('.lab-pe-detail');
  new MutationObserver(() => { const t = box.querySelector('.lab-pe-detail-title');
    if (t) window.__labDetailTitles.push(t.innerText); }).observe(box, {childList: true, subtree: true}); }"""


def settle(page) -> None:
    """Two animation frames: cytoscape draws and the page lays out after a scroll."""
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def click_node(watch: PageWatch, node_id: str, where: str) -> None:
    """Click ``node_id`` at its on-screen position now; the detail panel (Python's describe) must show it."""
    page = watch.page
    pos = page.evaluate(NODE_AT_JS, node_id)
    assert pos["inside"], (node_id, pos, where)
    page.mouse.move(pos["x"], pos["y"])
    page.mouse.click(pos["x"], pos["y"])
    offsets = page.evaluate(OFFSETS_JS)
    watch.wait_for(
        "(id) => { const t = document.querySelector('.lab-pe-detail .lab-pe-detail-title'); return t && t.innerText === id; }",
        arg=node_id,
        what=f"the detail panel to show {node_id} clicked at ({pos['x']:.0f}, {pos['y']:.0f}) {where} "
        f"(cytoscape's container top: cached {offsets['cached_top']}, real {offsets['real_top']:.0f})",
        timeout_s=20,
    )


def hover_node(watch: PageWatch, node_id: str, where: str) -> None:
    """Move the mouse onto ``node_id`` at its on-screen position now; the tooltip must name it."""
    page = watch.page
    pos = page.evaluate(NODE_AT_JS, node_id)
    assert pos["inside"], (node_id, pos, where)
    page.mouse.move(pos["x"] - 30, pos["y"] - 30)
    page.mouse.move(pos["x"], pos["y"], steps=3)
    offsets = page.evaluate(OFFSETS_JS)
    watch.wait_for(
        f"(id) => ({TIP_JS})().includes(id)",
        arg=node_id,
        what=f"the tooltip to name {node_id} hovered at ({pos['x']:.0f}, {pos['y']:.0f}) {where} "
        f"(cytoscape's container top: cached {offsets['cached_top']}, real {offsets['real_top']:.0f})",
        timeout_s=10,
    )


def explore_scrolled(watch: PageWatch, expected_ids: set[str], hide_type: str, expected_visible: set[str], name: str) -> None:
    """The checks both pages share (see the module docstring); ``name`` prefixes the screenshots."""
    page = watch.page
    n = len(expected_ids)
    watch.wait_for(
        f"(n) => {{ const cy = {CY}; return cy && cy.nodes().length === n && cy.container().clientWidth > 0; }}",
        arg=n,
        what=f"the explorer's {n} nodes, drawn",
        timeout_s=120,
    )
    assert set(page.evaluate(f"() => {CY}.nodes().map(n => n.id())")) == expected_ids
    assert page.evaluate(f"() => {CY}.nodes('.hidden').length") == 0
    page.evaluate(RECORD_DETAILS_JS)

    # 1. The mouse moves while the explorer is far from where it will be clicked (cytoscape reads its
    # container's offset on any mouse move in the window), then the user scrolls back to it.
    for end in ("bottom", "top"):
        before, after = page.evaluate(SCROLL_TO_END_JS, end)
        if abs(after - before) > 300:
            break
    else:
        pytest.fail(f"the page does not scroll the explorer far ({before} -> {after})")
    settle(page)
    page.mouse.move(3, page.viewport_size["height"] - 3)
    page.mouse.move(6, page.viewport_size["height"] - 6)
    top = page.evaluate(CENTER_JS)
    settle(page)
    first = page.evaluate(PICK_JS, None)
    assert first, "no node of the explorer is in view"
    click_node(watch, first, f"after scrolling the explorer from {after:.0f} px to {top:.0f} px")
    watch.wait_for(f"(id) => {CY}.$id(id).hasClass('focus')", arg=first, what=f"{first} highlighted as the focus")
    watch.wait_for(
        "(id) => { const r = document.querySelectorAll('.lab-pe-tl-row.selected');"
        " return r.length === 1 && r[0].dataset.id === id; }",
        arg=first,
        what=f"the timeline row of {first} selected by the click on its node",
    )

    # 2. Scrolled again with the explorer still in view: hover, then click another node.
    moved = page.evaluate(SCROLL_BY_JS, 150) or page.evaluate(SCROLL_BY_JS, -150)
    assert moved, "the page did not scroll"
    settle(page)
    second = page.evaluate(PICK_JS, [i for i in expected_ids if i != first])
    assert second, "no other node of the explorer is in view"
    hover_node(watch, second, f"after scrolling {moved} px more")
    click_node(watch, second, f"after scrolling {moved} px more")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}_scrolled_click.png"))

    # 3. Untick a type: exactly what Python's rule leaves out is hidden, and hidden nodes do not answer.
    page.locator(f".lab-pe-filter-types input[value='{hide_type}']").click()
    hidden_expected = sorted(expected_ids - expected_visible)
    watch.wait_for(
        f"(ids) => {{ const h = {CY}.nodes('.hidden').map(n => n.id()).sort(); return JSON.stringify(h) === JSON.stringify(ids); }}",
        arg=hidden_expected,
        what=f"the {len(hidden_expected)} {hide_type} nodes hidden (Python's visible ids)",
    )
    watch.wait_for(
        "(s) => document.querySelector('.lab-pe-count').innerText.startsWith(s)",
        arg=f"{len(expected_visible)} of {n} nodes, ",
        what="the counter to follow the filter",
    )
    hidden = page.evaluate(PICK_JS, hidden_expected)
    assert hidden, f"no hidden {hide_type} node lies inside the view"
    pos = page.evaluate(NODE_AT_JS, hidden)
    page.mouse.move(pos["x"] - 30, pos["y"] - 30)
    page.mouse.move(pos["x"], pos["y"], steps=3)
    page.wait_for_timeout(300)
    assert hidden not in page.evaluate(TIP_JS), f"the hidden node {hidden} shows a tooltip"
    page.evaluate("() => { window.__labDetailTitles = []; }")  # from here on
    page.mouse.click(pos["x"], pos["y"])
    visible = page.evaluate(PICK_JS, None)
    click_node(watch, visible, "after clicking a hidden node")  # the hidden node's click came first, in order
    titles = page.evaluate("() => window.__labDetailTitles")
    assert hidden not in titles, (hidden, titles)
    page.screenshot(path=str(ARTIFACTS / f"{name}_hidden_type.png"))
    assert not watch.page_errors, watch.page_errors



def _rgb(hex_color: str) -> str:
    h = hex_color.lstrip("#")
    return "rgb({},{},{})".format(*(int(h[i : i + 2], 16) for i in (0, 2, 4)))


LEGEND_JS = """() => Array.from(document.querySelectorAll('.lab-pe-legend-entry')).map(e => {
  const svg = e.querySelector('svg'); const shape = svg.querySelector('polygon, rect, ellipse');
  return {kind: e.dataset.kind, key: e.dataset.key, shape: svg.dataset.shape || null,
          fill: shape.getAttribute('fill'), n: e.querySelector('.n').innerText}; })"""
# per type drawn: the shape and fill colour cytoscape draws its nodes with
DRAWN_TYPES_JS = f"""() => {{ const out = {{}}; {CY}.nodes().forEach(n => {{ const t = n.data('type');
  if (!(t in out) && !n.hasClass('ineligible')) out[t] = {{shape: n.style('shape'), color: n.style('background-color')}};
  if (!(t in out)) out[t] = null; }}); return out; }}"""
# each timeline row's bar, as fractions of its track (left edge, width) and the track's width in px
TIMELINE_JS = """() => Array.from(document.querySelectorAll('.lab-pe-tl-row')).map(r => {
  const t = r.querySelector('.lab-pe-tl-track').getBoundingClientRect(), b = r.querySelector('.lab-pe-tl-bar').getBoundingClientRect();
  return {id: r.dataset.id, left: (b.left - t.left) / t.width, width: b.width / t.width, track: t.width,
          hidden: r.classList.contains('hidden')}; })"""


def check_panels(watch: PageWatch, elements: dict, timeline_rows: list[dict], query: str, time_at: float, unit_re: str, name: str) -> None:
    """The legend, search, timeline, tooltip-on-hide and time slider checks of the module docstring, against
    what ``lab.provenance.view`` / ``lab.provenance.timeline`` compute for ``elements`` (the page's explorer)."""
    import re

    from lab.provenance.view import NODE_ENCODING, legend, search, visible_ids

    page = watch.page
    ids = [el["data"]["id"] for el in elements["nodes"]]
    page.locator(".lab-pe-cy").scroll_into_view_if_needed()
    settle(page)

    # legend: exactly the types drawn, each swatch in the shape and colour its nodes are drawn with
    shown = page.evaluate(LEGEND_JS)
    drawn = page.evaluate(DRAWN_TYPES_JS)
    want = legend(elements)
    assert [(e["kind"], e["key"]) for e in shown] == [(e["kind"], e["key"]) for e in want], (shown, want)
    assert [e["key"] for e in shown if e["kind"] == "type"] == [t for t in NODE_ENCODING if t in drawn]
    for e in shown:
        if e["kind"] == "type":
            assert e["shape"] == NODE_ENCODING[e["key"]]["shape"] and e["fill"] == NODE_ENCODING[e["key"]]["color"], e
            if drawn[e["key"]] is not None:  # an eligible node of that type: its drawn style
                assert drawn[e["key"]]["shape"] == e["shape"] and drawn[e["key"]]["color"] == _rgb(e["fill"]), (e, drawn[e["key"]])
    counts = {(e["kind"], e["key"]): f"{e['shown']}/{e['count']}" for e in want}
    assert {(e["kind"], e["key"]): e["n"] for e in shown} == counts
    marks = set(page.evaluate(f"() => {CY}.nodes().map(n => n.classes()).flat()"))
    assert {e["key"] for e in shown if e["kind"] == "border"} - {"trust"} == marks & {e["key"] for e in want if e["kind"] == "border"}

    # timeline: one row per node, in Python's order, bars where Python's timings put them
    rows = page.evaluate(TIMELINE_JS)
    assert [r["id"] for r in rows] == [r["id"] for r in timeline_rows] and sorted(r["id"] for r in rows) == sorted(ids)
    for got, py in zip(rows, timeline_rows, strict=True):
        px = got["track"]
        assert abs(got["left"] - py["left"]) * px <= 1.0, (got, py)
        assert abs(got["width"] * px - max(py["width"] * px, 2.0)) <= 1.0, (got, py)  # an instant: a 2 px tick
    widths = {round(py["width"], 6) for py in timeline_rows}
    assert len(widths) > 2, widths  # the timings differ, so do the bars

    # a click on a timeline row selects its node in the graph (and the row)
    row = next(r for r in timeline_rows[2:] if r["type"] != "agent")
    page.locator(f".lab-pe-tl-row[data-id='{row['id']}']").click()
    watch.wait_for(
        f"(id) => document.querySelector('.lab-pe-detail-title')?.innerText === id && {CY}.$id(id).hasClass('focus')"
        " && document.querySelector('.lab-pe-tl-row.selected')?.dataset.id === id",
        arg=row["id"],
        what=f"the timeline row of {row['id']} to select its node",
    )

    # search: Python's hits are marked in the graph and listed; Enter selects the first
    hits = search(elements, query)
    assert hits["total"] >= 2, hits
    box = page.locator(".lab-pe-search")
    box.click()
    box.fill("")
    page.keyboard.type(query, delay=20)
    hit_ids = sorted(h["id"] for h in hits["hits"])
    watch.wait_for(
        f"(ids) => JSON.stringify({CY}.nodes('.match').map(n => n.id()).sort()) === JSON.stringify(ids)"
        " && document.querySelectorAll('.lab-pe-hit').length === ids.length",
        arg=hit_ids,
        what=f"the {len(hit_ids)} nodes matching {query!r} marked in the graph and listed",
    )
    assert page.evaluate(f"() => {CY}.nodes('.match').length") == hits["total"]
    assert page.evaluate("() => Array.from(document.querySelectorAll('.lab-pe-hit')).map(h => h.dataset.id)") == [h["id"] for h in hits["hits"]]
    page.keyboard.press("Enter")
    first = hits["hits"][0]["id"]
    watch.wait_for(
        f"(id) => document.querySelector('.lab-pe-detail-title')?.innerText === id && {CY}.$id(id).hasClass('focus')",
        arg=first,
        what=f"Enter in the search box to select its first hit {first}",
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}_search_timeline.png"))
    page.locator(".lab-pe").screenshot(path=str(ARTIFACTS / f"{name}_widget.png"))

    # an open tooltip closes when a filter hides its node (the mouse does not move), and its row hides too
    page.locator(".lab-pe-cy").scroll_into_view_if_needed()
    settle(page)
    target_type = "source"
    victim = page.evaluate(PICK_JS, [i for i in ids if next(e for e in elements["nodes"] if e["data"]["id"] == i)["data"]["type"] == target_type])
    assert victim, f"no {target_type} node in view"
    hover_node(watch, victim, "before hiding its type")
    page.evaluate(f"() => document.querySelector(\".lab-pe-filter-types input[value='{target_type}']\").focus()")
    page.keyboard.press("Space")
    watch.wait_for(
        f"(id) => {CY}.$id(id).hasClass('hidden') && ({TIP_JS})() === ''"
        " && document.querySelector(`.lab-pe-tl-row[data-id='${id}']`).classList.contains('hidden')",
        arg=victim,
        what=f"{victim}'s tooltip closed and its row hidden once its type is unticked",
    )
    page.screenshot(path=str(ARTIFACTS / f"{name}_tooltip_closed.png"))
    page.keyboard.press("Space")  # shown again
    watch.wait_for(f"() => {CY}.nodes('.hidden').length === 0", what="every node shown again")

    # the time slider: its reading has the unit, and it hides what Python's rule hides
    label = page.locator(".lab-pe-time-label").inner_text()
    assert re.fullmatch(rf"all \({unit_re} – {unit_re}\)", label), label
    page.evaluate(
        "(v) => { const i = document.querySelector('.lab-pe-time-input'); i.value = String(v); i.dispatchEvent(new Event('input')); }", time_at
    )
    hidden = sorted(set(ids) - set(visible_ids(elements, None, time_at)))
    assert hidden, time_at
    watch.wait_for(
        f"(ids) => JSON.stringify({CY}.nodes('.hidden').map(n => n.id()).sort()) === JSON.stringify(ids)",
        arg=hidden,
        what=f"the nodes after {time_at} hidden by the time slider",
    )
    label = page.locator(".lab-pe-time-label").inner_text()
    assert re.fullmatch(rf"≤ {unit_re} \(of {unit_re} – {unit_re}\)", label), label
    page.screenshot(path=str(ARTIFACTS / f"{name}_time_slider.png"))
    page.evaluate("() => { const i = document.querySelector('.lab-pe-time-input'); i.value = i.max; i.dispatchEvent(new Event('input')); }")
    watch.wait_for(f"() => {CY}.nodes('.hidden').length === 0", what="every node shown again at the slider's end")
    assert not watch.page_errors, watch.page_errors


def voila_lesson_notebook(path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Explore the run\n\n" + LESSON),
        nbformat.v4.new_code_cell(NOTEBOOK_CODE),
        nbformat.v4.new_markdown_cell("## After the explorer\n\n" + LESSON),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.mark.browser
@pytest.mark.slow
def test_voila_explorer_answers_clicks_and_hovers_at_any_scroll_position(tmp_path):
    from playwright.sync_api import sync_playwright

    from lab.provenance.timeline import timeline
    from lab.provenance.view import explorer_elements, visible_ids

    executable = chromium()
    notebook = voila_lesson_notebook(tmp_path / "explorer.ipynb")
    scope: dict = {}
    exec(GRAPH_CODE, scope)  # the page's graph, built here too: what Python shows for it
    py_elements = explorer_elements(scope["g"], agent="bob")
    py_rows = timeline(scope["g"], [n["data"]["id"] for n in py_elements["nodes"]])["rows"]

    with voila_server(notebook, tmp_path / "voila.log") as port, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            watch = PageWatch(page, "provenance_explorer_voila")
            net = NetworkWatch(page, "provenance_explorer_voila", voila=True)
            page.goto(f"http://127.0.0.1:{port}/", timeout=300_000)
            watch.wait_for(page.locator(".lab-pe-cy canvas"), what="the explorer's canvas", timeout_s=300)
            # the greyed-out node for bob carries its reason
            watch.wait_for(f"() => {CY} && {CY}.nodes().length === 8", what="the graph's 8 nodes")
            assert "missing label 'finance'" in page.evaluate(f"() => {CY}.$id('m1').data('reason')")
            # what Python's rule leaves visible without claims (the elements as the notebook built them)
            elements = {"nodes": page.evaluate(f"() => {CY}.nodes().map(n => ({{data: n.data()}}))")}
            types = sorted({e["data"]["type"] for e in elements["nodes"]} - {"claim"})
            expected_visible = set(visible_ids(elements, {"types": types}))
            assert expected_visible == VOILA_IDS - {"c1"}
            explore_scrolled(watch, VOILA_IDS, "claim", expected_visible, "provenance_explorer_voila")

            # a real click reaches Python (the Label) and Python's lineage comes back as highlight classes
            page.locator(".lab-pe-filter-types input[value='claim']").click()
            watch.wait_for(f"() => {CY}.nodes('.hidden').length === 0", what="every node shown again")
            page.locator(".lab-pe-cy").scroll_into_view_if_needed()
            settle(page)
            click_node(watch, "m1", "after showing every node again")
            watch.wait_for(
                "() => document.querySelector('.lab-selected-label').innerText.includes('selected: m1')",
                what="the Python-side label to say 'selected: m1'",
            )
            watch.wait_for(
                f"() => {{ const cy = {CY}; return cy.$id('s1').hasClass('ancestor') && cy.$id('x1').hasClass('descendant')"
                " && cy.$id('m1').hasClass('focus'); }",
                what="m1's lineage highlighted",
            )
            watch.wait_for(f"() => ({DETAIL_JS})().includes('balance summary')", what="m1's details")
            classes = page.evaluate(f"() => Object.fromEntries({CY}.nodes().map(n => [n.id(), n.classes()]))")
            assert "ineligible" in classes["m1"] and "ineligible" not in classes["s2"]
            assert "ancestor" in classes["s1"] and "descendant" in classes["c1"] and "faded" in classes["bob"]
            assert page.evaluate("() => window.__labExplorers.length") == 1
            page.screenshot(path=str(ARTIFACTS / "provenance_explorer_click.png"))
            assert [n["data"]["id"] for n in py_elements["nodes"]] == page.evaluate(f"() => {CY}.nodes().map(n => n.id())")
            check_panels(watch, py_elements, py_rows, "hat271", 4.0, r"\d+(?:\.\d+)? s", "provenance_explorer_voila")
            assert not watch.page_errors, watch.page_errors
            net.check()
        finally:
            browser.close()


RUN = "tau-airline/task32/trial1"
# Appended to the test's copy of notebook 03: what the explorer was given (its elements' node ids) and
# which of them Python's rule (lab.provenance.view.visible_ids) leaves visible without the claims.
STATE_CELL = """
import json as _json
from lab.provenance.view import visible_ids as _visible_ids
_types = [t for t in explorer.elements["types"] if t != "claim"]
print("EXPLORER-STATE " + _json.dumps({"ids": [n["data"]["id"] for n in explorer.elements["nodes"]],
                                       "visible_without_claims": _visible_ids(explorer.elements, {"types": _types}),
                                       "elements": explorer.elements, "timeline": explorer.timeline["rows"]}))
"""


def append_state_cell(notebook) -> None:
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(STATE_CELL))
    nbformat.write(nb, notebook)


@pytest.mark.browser
@pytest.mark.slow
def test_lab_notebook_03_explorer_answers_clicks_and_hovers_after_run_all(tmp_path):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    root = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", root)
    append_state_cell(root / "03_provenance.ipynb")
    token = secrets.token_urlsafe(16)
    with make_server("lab", "LAB_PORT", tmp_path / "lab.log", LAB_TOKEN=token, LAB_ROOT=str(root)) as port:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1500, "height": 1000})
                watch = PageWatch(page, "provenance_explorer_lab")
                net = NetworkWatch(page, "provenance_explorer_lab")
                page.goto(f"http://127.0.0.1:{port}/lab/tree/03_provenance.ipynb?token={token}", timeout=300_000)
                watch.wait_for(KERNEL_IDLE_JS, what="the kernel (status bar: Python 3 | Idle)", timeout_s=180)
                run_all_cells(page)
                # the appended cell is the last: every cell has run once it has printed
                state = watch.wait_for(
                    "() => { const cells = document.querySelectorAll('.jp-Notebook .jp-CodeCell');"
                    " const out = cells[cells.length - 1].querySelector('.jp-OutputArea-output');"
                    " return out && out.innerText.includes('EXPLORER-STATE ') && out.innerText; }",
                    what="Run All to reach the last cell",
                    timeout_s=300,
                )
                state = json.loads(state.split("EXPLORER-STATE ", 1)[1])
                expected_ids, expected_visible = set(state["ids"]), set(state["visible_without_claims"])
                assert f"{RUN}/msg16/call0" in expected_ids and len(expected_ids) == len(state["ids"]) > 10
                assert expected_visible < expected_ids  # the run has claims to hide
                watch.wait_for(KERNEL_IDLE_JS, what="the kernel idle after Run All", timeout_s=120)
                explore_scrolled(watch, expected_ids, "claim", expected_visible, "provenance_explorer_lab")
                page.locator(".lab-pe-filter-types input[value='claim']").click()
                watch.wait_for(f"() => {CY}.nodes('.hidden').length === 0", what="every node shown again")
                check_panels(watch, state["elements"], state["timeline"], "HAT271", 11.0, r"message \d+(?:\.\d+)?", "provenance_explorer_lab")

                # re-running the explorer's cell replaces its view: the old one's registration goes with it
                page.evaluate(f"() => {{ window.__labOldCy = {CY}; }}")
                cell = page.locator(".jp-CodeCell", has=page.locator(".lab-pe"))
                cell.locator(".jp-InputArea-editor").click()
                page.keyboard.press("Control+Enter")
                watch.wait_for(
                    "() => window.__labOldCy.destroyed() && window.__labExplorers.length === 1"
                    " && window.__labExplorers[0] !== window.__labOldCy && !window.__labExplorers[0].destroyed()",
                    what="one registered explorer after re-running its cell (the old view's entry removed)",
                    timeout_s=60,
                )
                assert not watch.page_errors, watch.page_errors
                net.check()
            finally:
                browser.close()
