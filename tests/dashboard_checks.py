"""Browser checks of the queue dashboards (QueueDashboard of notebook 01, LiveSitesDashboard of notebook 02), shared
by the JupyterLab and Voila tests: what the plots drew (traces with points inside their plot areas), the job table's
rows and that a click on a header reorders them, the filters, and that the widget fits its output area."""

from __future__ import annotations

import pytest

from tests.browser import ARTIFACTS, PageWatch

QUEUE = ".lab-queue-dashboard"
SITES = ".lab-live-dashboard"

# What a dashboard's plotly chart drew, in page pixels: every line, marker and bar against the plot areas
# (plotly's drag rectangles, one per subplot).
PLOT_JS = """(root) => {
  const gd = document.querySelector(root + ' .js-plotly-plot');
  const areas = Array.from(gd.querySelectorAll('.draglayer .nsewdrag')).map(e => e.getBoundingClientRect());
  const inside = (r) => areas.some(a => r.left >= a.left - 2 && r.right <= a.right + 2 && r.top >= a.top - 2 && r.bottom <= a.bottom + 2);
  const rects = (sel) => Array.from(gd.querySelectorAll(sel)).map(e => e.getBoundingClientRect()).filter(r => r.width > 0 || r.height > 0);
  const centre = (r) => inside({left: (r.left + r.right) / 2, right: (r.left + r.right) / 2, top: (r.top + r.bottom) / 2, bottom: (r.top + r.bottom) / 2});
  const lines = rects('.scatterlayer .trace path.js-line');
  const points = rects('.scatterlayer .trace path.point');
  const bars = rects('.barlayer .point path').filter(r => r.height > 0.5);
  const titles = Array.from(gd.querySelectorAll('.annotation-text')).map(e => e.textContent);
  return {areas: areas.length, lines: lines.length, lines_inside: lines.filter(inside).length,
          points: points.length, points_inside: points.filter(centre).length, bars: bars.length, bars_inside: bars.filter(inside).length,
          annotations: titles};
}"""

# Does the widget fit its output area (JupyterLab and Voila: .jp-OutputArea-output) and the window?
FIT_JS = """(root) => {
  const el = document.querySelector(root);
  const area = el.closest('.jp-OutputArea-output') || document.body;
  const a = area.getBoundingClientRect(), b = el.getBoundingClientRect();
  let right = 0, widest = '';
  // HTML boxes and the plot's <svg> itself (what is inside an svg is clipped to it; plotly's axis drag handles reach past)
  for (const e of el.querySelectorAll('*')) {
    if (!(e instanceof HTMLElement) && !e.classList.contains('main-svg')) continue;
    const r = e.getBoundingClientRect();
    if (r.width > 0 && r.right > right) { right = r.right; widest = e.tagName + '.' + (e.getAttribute('class') || ''); }
  }
  const svg = el.querySelector('.js-plotly-plot .main-svg').getBoundingClientRect();
  return {area_width: a.width, area_right: a.right, widget_right: b.right, content_right: right, widest: widest,
          plot_right: svg.right, plot_width: svg.width, window_width: window.innerWidth,
          scroll_width: el.scrollWidth, client_width: el.clientWidth};
}"""

# A sortable table's rows as drawn: ids, groups, and each cell's text and sort key for one column.
TABLE_JS = """([table, key]) => {
  const t = document.querySelector(table);
  const heads = Array.from(t.querySelectorAll('thead th'));
  const k = heads.findIndex(th => th.dataset.key === key);
  const rows = Array.from(t.querySelectorAll('tbody tr'));
  return {ids: rows.map(r => r.dataset.id), groups: rows.map(r => r.dataset.group),
          text: rows.map(r => k < 0 ? null : r.cells[k].textContent),
          keys: rows.map(r => { const c = r.cells[k]; return c && c.dataset.sort !== undefined ? c.dataset.sort : null; }),
          headers: heads.map(th => th.textContent), empty: (t.querySelector('.lab-empty') || {}).textContent || '',
          count: (t.querySelector('.lab-table-count') || {}).textContent || ''};
}"""


# On a timeout: what was drawn, each trace's name and number of points, and the widget's status line.
PLOT_STATE_JS = f"""(root) => {{
  const gd = document.querySelector(root + ' .js-plotly-plot');
  return {{drawn: gd ? ({PLOT_JS})(root) : null,
          traces: gd && gd.data ? gd.data.map(t => [t.name, (t.x || []).length]) : null,
          status: (document.querySelector(root + ' .lab-live-status') || {{}}).innerText || null}};
}}"""


def check_plot(watch: PageWatch, root: str, *, lines: int, points: int = 0, bars: int = 0) -> dict:
    """At least ``lines`` lines, ``points`` markers and ``bars`` bars drawn, every one inside a plot area."""
    drawn = watch.wait_for(
        f"() => {{ const d = ({PLOT_JS})({root!r}); return d.lines >= {lines} && d.points >= {points} && d.bars >= {bars} && d; }}",
        what=f"{root}'s chart: {lines} lines, {points} markers, {bars} bars", timeout_s=300, state=PLOT_STATE_JS, arg=root)
    assert drawn["lines_inside"] == drawn["lines"], drawn
    assert drawn["points_inside"] == drawn["points"], drawn
    assert drawn["bars_inside"] == drawn["bars"], drawn
    return drawn


def check_fits(page, root: str, *, area_width: tuple[float, float] | None = None) -> dict:
    """Nothing of the widget reaches past its output area (no horizontal clipping or scrolling)."""
    fit = page.evaluate(FIT_JS, root)
    if area_width is not None:
        lo, hi = area_width
        assert lo <= fit["area_width"] <= hi, f"the output area is {fit['area_width']} px wide, not {lo}-{hi} px: {fit}"
    assert fit["content_right"] <= fit["area_right"] + 1, f"{fit['widest']} reaches past the output area: {fit}"
    assert fit["plot_right"] <= fit["area_right"] + 1 and fit["plot_width"] >= 0.9 * fit["area_width"] - 40, fit  # fills it, no more
    assert fit["scroll_width"] <= fit["client_width"] + 1 and fit["widget_right"] <= fit["window_width"], fit
    return fit


def table_state(page, table: str, key: str) -> dict:
    return page.evaluate(TABLE_JS, [table, key])


def as_number(keys: list) -> list[float]:
    return [float(k) for k in keys]


def check_header_sorts(watch: PageWatch, table: str, key: str, *, exact: bool = True) -> tuple[list, list]:
    """Click column ``key``'s header: rows ascending by its keys; click again: descending. Returns the two id orders.
    ``exact=False`` for a table the kernel redraws meanwhile (a live view): the rows need not stay the same."""
    page = watch.page
    before = table_state(page, table, key)
    header = page.locator(f"{table} thead th[data-key='{key}']")
    header.click()
    watch.wait_for(f"() => ({TABLE_JS})([{table!r}, {key!r}]).headers.some(h => h.endsWith('\\u25b2'))", what=f"{key} sorted ascending")
    up = table_state(page, table, key)
    known = [k for k in up["keys"] if k is not None]
    assert as_number(known) == sorted(as_number(known)), up
    assert up["keys"][len(known):] == [None] * (len(up["keys"]) - len(known)), up  # unknowns last
    header.click()
    watch.wait_for(f"() => ({TABLE_JS})([{table!r}, {key!r}]).headers.some(h => h.endsWith('\\u25bc'))", what=f"{key} sorted descending")
    down = table_state(page, table, key)
    known = [k for k in down["keys"] if k is not None]
    assert as_number(known) == sorted(as_number(known), reverse=True), down
    if exact:
        assert sorted(down["ids"]) == sorted(up["ids"]) == sorted(before["ids"])  # the same rows, reordered
        if len(set(known)) > 1:
            assert down["ids"] != up["ids"]
    return up["ids"], down["ids"]


def check_filters(watch: PageWatch, table: str, group: str, *, exact: bool = True) -> None:
    """The state filter keeps only ``group``'s rows; the text filter one site's; clearing both gives all back."""
    page = watch.page
    everything = table_state(page, table, "job")
    page.locator(f"{table} select.lab-table-group").select_option(group)
    watch.wait_for(f"() => ({TABLE_JS})([{table!r}, 'job']).groups.every(g => g === {group!r})", what=f"only {group} rows")
    only = table_state(page, table, "job")
    assert only["ids"] and set(only["groups"]) == {group}, only
    assert not exact or len(only["ids"]) == everything["groups"].count(group), (only, everything)
    page.locator(f"{table} select.lab-table-group").select_option("")
    site = everything["ids"][-1].split("/")[0]  # the last row's site, typed into the text filter
    page.locator(f"{table} input.lab-table-text").fill(site)
    want = sorted(i for i in everything["ids"] if i.startswith(f"{site}/"))
    watch.wait_for(f"() => {{ const ids = ({TABLE_JS})([{table!r}, 'job']).ids; return ids.length > 0 && ids.every(i => i.startsWith({site + '/'!r})); }}",
                   what=f"the text filter: {site}'s rows only")
    assert not exact or sorted(table_state(page, table, "job")["ids"]) == want
    page.locator(f"{table} input.lab-table-text").fill("no such job anywhere")
    watch.wait_for(f"() => ({TABLE_JS})([{table!r}, 'job']).empty === 'no row matches the filter'", what="an empty filter result")
    page.locator(f"{table} input.lab-table-text").fill("")
    if exact:
        watch.wait_for(f"() => ({TABLE_JS})([{table!r}, 'job']).ids.length === {len(everything['ids'])}", what="every row back")


# ---- notebook 01: QueueDashboard -------------------------------------------------------------------

def pending_at_day(day: float) -> list[int]:
    """Pending jobs at ``day`` days into each of notebook 01's three sites, as lab.hpc.queue computes them."""
    from lab.hpc import QueueReplay, load_trace

    replays = [QueueReplay(load_trace(name)) for name in ("theta_2022", "theta_2023", "hpc2n")]
    return [r.snapshot(r.first_submit + day * 86400).pending for r in replays]


# One figure, one column of subplots per site: 7 traces and 2 marker lines per site.
MARKERS_JS = f"""() => {{ const el = document.querySelector('{QUEUE} .js-plotly-plot');
    return [0, 1, 2].map(k => [el.layout.shapes[2 * k].x0, el.data[7 * k + 4].y[0]]); }}"""
JOBS = ".lab-queue-jobs"


def check_queue_dashboard(watch: PageWatch, screenshot: str, *, area_width: tuple[float, float] | None = None) -> None:
    """On a page showing notebook 01's dashboard: it opens at day 30 with every site's lines, markers and bars
    inside their plots, fits its output area, lists the jobs pending and running then (sortable by a header
    click, filterable by state and text); one day of slider moves every marker and the table. Saves a screenshot."""
    page = watch.page
    drawn = check_plot(watch, QUEUE, lines=3 * 4, points=3 * 2, bars=3)
    assert drawn["areas"] == 9, drawn  # 3 sites x 3 panels
    watch.wait_for(f"() => document.querySelectorAll('{JOBS} tbody tr').length > 0", what="the jobs table's rows")
    before = table_state(page, JOBS, "waited")
    markers = page.evaluate(MARKERS_JS)
    assert [x0 for x0, _ in markers] == pytest.approx([30.0, 30.0, 30.0]), markers  # opens at day 30
    assert [y for _, y in markers] == pending_at_day(30)
    assert {"pending", "running"} <= set(before["groups"]) and before["headers"][:4] == ["site", "job", "state", "waited so far"]
    sites = [i.split("/")[0] for i in before["ids"]]
    assert set(sites) == {"theta_2022", "theta_2023", "hpc2n"} or set(sites) == {"Theta 2022", "Theta 2023", "HPC2N"}, sites
    check_fits(page, QUEUE, area_width=area_width)
    page.locator(JOBS).scroll_into_view_if_needed()
    check_header_sorts(watch, JOBS, "waited")
    check_header_sorts(watch, JOBS, "procs")
    check_filters(watch, JOBS, "running")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator(JOBS).screenshot(path=str(ARTIFACTS / screenshot.replace(".png", "_table.png")))

    handle = page.locator(f"{QUEUE} .widget-slider .noUi-handle").first
    handle.focus()
    for _ in range(4):  # 4 steps of 6 h, pressed without waiting: one day later
        page.keyboard.press("ArrowRight")
    watch.wait_for(
        f"() => document.querySelector('{QUEUE} .js-plotly-plot').layout.shapes.every(s => Math.abs(s.x0 - 31) < 1e-9)",
        what="every site's day marker at day 31",
    )
    watch.wait_for(f"(before) => ({TABLE_JS})([{JOBS!r}, 'waited']).ids.join() !== before.join()", arg=before["ids"],
                   what="the jobs table to change")
    after = page.evaluate(MARKERS_JS)
    assert [x0 for x0, _ in after] == pytest.approx([31.0, 31.0, 31.0])
    assert [y for _, y in after] == pending_at_day(31)
    sorted_now = table_state(page, JOBS, "procs")  # the sort chosen above is kept for the new rows
    known = as_number([k for k in sorted_now["keys"] if k is not None])
    assert known == sorted(known, reverse=True), sorted_now
    check_plot(watch, QUEUE, lines=3 * 4, points=3 * 2, bars=3)
    check_fits(page, QUEUE, area_width=area_width)
    page.locator(QUEUE).scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / screenshot), full_page=True)


# ---- notebook 02 and the Voila live page: LiveSitesDashboard ------------------------------------------


SITE_JOBS, CANDIDATES, DECISIONS = ".lab-live-jobs", ".lab-live-candidates", ".lab-live-decisions"
STATUS_JS = f"() => (document.querySelector('{SITES} .lab-live-status') || {{}}).innerText || ''"
# a pending job whose start Slurm's backfill has planned: its start cell reads "in <duration> (<clock>)"
PLANNED_JS = f"""() => ({TABLE_JS})([{SITE_JOBS!r}, 'start']).text.filter((t, i, all) => /^in /.test(t)).length"""
# the same on one site (its name the argument): a pending job there whose start Slurm has planned
PLANNED_ON_JS = f"""(site) => {{ const s = ({TABLE_JS})([{SITE_JOBS!r}, 'start']);
    return s.ids.some((id, i) => id.startsWith(site + '/') && s.groups[i] === 'pending' && /^in /.test(s.text[i])); }}"""


def check_sites_live(watch: PageWatch, sites: list[str], screenshot: str, *, area_width: tuple[float, float] | None = None,
                     pending_on: str | None = None) -> dict:
    """While jobs run: every site's panel has its lines inside the plot; the jobs table lists pending jobs with Slurm's
    estimated start (on ``pending_on``, if given) and sorts by a header click; the widget fits its output area."""
    page = watch.page
    watch.wait_for(f"() => document.querySelector('{SITES} .js-plotly-plot')", what="the live dashboard's chart", timeout_s=300)
    watch.wait_for(PLANNED_JS, what="a pending job with Slurm's estimated start in the jobs table", timeout_s=180)
    if pending_on is not None:  # each queue sample (every few seconds) brings Slurm's latest plan: wait for this site's
        watch.wait_for(PLANNED_ON_JS, arg=pending_on, what=f"a pending job on {pending_on} with Slurm's estimated start",
                       timeout_s=120)
    drawn = check_plot(watch, SITES, lines=3 * len(sites))
    assert drawn["areas"] == 2 * len(sites), drawn
    for name in sites:  # every site's title is drawn, inside the output area (the 4th site used to be clipped)
        assert name in drawn["annotations"], drawn
    jobs = table_state(page, SITE_JOBS, "start")
    assert jobs["headers"][:7] == ["site", "job", "state", "waited so far", "start", "walltime asked", "processors"], jobs
    assert "pending" in jobs["groups"] and "running" in jobs["groups"], jobs
    check_fits(page, SITES, area_width=area_width)
    page.locator(SITE_JOBS).scroll_into_view_if_needed()
    check_header_sorts(watch, SITE_JOBS, "waited", exact=False)
    check_header_sorts(watch, SITE_JOBS, "start", exact=False)
    check_filters(watch, SITE_JOBS, "pending", exact=False)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator(SITES).scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / screenshot), full_page=True)
    return jobs


def check_candidates(watch: PageWatch, sites: list[str]) -> None:
    """What each site showed the newest decision: one row per site, the chosen one marked; sortable."""
    page = watch.page
    watch.wait_for(f"() => document.querySelectorAll('{CANDIDATES} tbody tr').length === {len(sites)}",
                   what="one row per site in 'what each site showed'")
    seen = table_state(page, CANDIDATES, "done")
    assert sorted(seen["ids"]) == sorted(sites) and sum(g == "chosen" for g in seen["groups"]) == 1, seen
    chosen = seen["ids"][seen["groups"].index("chosen")]
    cells = page.evaluate(f"() => Array.from(document.querySelectorAll('{CANDIDATES} tbody tr')).map(r => r.cells[0].textContent)")
    assert f"\u25b6 {chosen}" in cells, cells
    check_header_sorts(watch, CANDIDATES, "done")
