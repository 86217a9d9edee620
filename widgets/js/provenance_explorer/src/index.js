// Front end of widgets.ProvenanceExplorer (anywidget). Draws what Python computed
// (lab.provenance.view, lab.provenance.timeline) and sends back user input: `selected` (a click on a
// node, a timeline row or a search hit), `filters` (checkboxes), `time_max` (time slider), `query`
// (search box). Which nodes are shown is Python's answer too (`visible`, from
// lab.provenance.view.visible_ids): this file only toggles classes from it. The legend, the counter,
// the slider's reading, the search hits and the timeline's rows and bar positions come computed.
import cytoscape from "cytoscape";
import dagre from "cytoscape-dagre";

cytoscape.use(dagre);

const DAGRE_MAX = 800; // above this many nodes: a cheap preset layout instead of dagre


const CSS = `
.lab-pe { display: flex; font: 12px sans-serif; border: 1px solid #ddd; }
.lab-pe-side { width: 240px; flex: none; padding: 6px; border-right: 1px solid #ddd; overflow-y: auto; max-height: 820px; box-sizing: border-box; }
.lab-pe-side fieldset { border: 1px solid #eee; margin: 0 0 6px 0; padding: 2px 6px; }
.lab-pe-side legend { font-weight: bold; }
.lab-pe-count { color: #555; margin: 2px 0 4px 0; }
.lab-pe-side label { display: block; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.lab-pe-search { width: 100%; box-sizing: border-box; margin: 4px 0 2px 0; }
.lab-pe-hits-count { color: #555; }
.lab-pe-hits { max-height: 150px; overflow-y: auto; margin-bottom: 6px; }
.lab-pe-hit { padding: 2px 3px; cursor: pointer; border-bottom: 1px solid #f0f0f0; }
.lab-pe-hit:hover, .lab-pe-hit.selected { background: #fff3bf; }
.lab-pe-hit small { color: #666; display: block; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.lab-pe-hit.hidden-node { color: #999; }
.lab-pe-legend-entry { display: flex; align-items: center; gap: 5px; margin: 2px 0; }
.lab-pe-legend-entry svg { flex: none; }
.lab-pe-legend-entry.none-shown { opacity: 0.4; }
.lab-pe-legend-entry .n { color: #666; margin-left: auto; white-space: nowrap; }
.lab-pe-main { flex: 1; display: flex; flex-direction: column; min-width: 0; }
.lab-pe-cy { height: 460px; width: 100%; position: relative; }
.lab-pe-time { padding: 4px 8px; border-top: 1px solid #eee; display: flex; gap: 8px; align-items: center; }
.lab-pe-time input { flex: 1; }
.lab-pe-time-label { white-space: nowrap; }
.lab-pe-bottom { display: flex; border-top: 1px solid #ddd; min-height: 0; }
.lab-pe-timeline { flex: 1; min-width: 0; max-height: 300px; overflow-y: auto; position: relative; }
.lab-pe-tl-head, .lab-pe-tl-row { display: flex; align-items: center; }
.lab-pe-tl-head { position: sticky; top: 0; background: #fafafa; border-bottom: 1px solid #eee; z-index: 1; height: 34px; }
.lab-pe-tl-head .lab-pe-tl-name { white-space: normal; line-height: 13px; }
.lab-pe-tl-name { width: 250px; flex: none; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; padding: 1px 4px; box-sizing: border-box; }
.lab-pe-tl-track { flex: 1; position: relative; height: 16px; margin-right: 12px; }
.lab-pe-tl-head .lab-pe-tl-track { height: 34px; }
.lab-pe-tl-tick { position: absolute; top: 2px; font-size: 10px; color: #666; transform: translateX(-50%); white-space: nowrap; }
.lab-pe-tl-tick::after { content: ""; position: absolute; left: 50%; top: 14px; height: 16px; border-left: 1px solid #ccc; }
.lab-pe-tl-unit { font-size: 10px; color: #444; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.lab-pe-tl-row { cursor: pointer; border-bottom: 1px solid #f4f4f4; }
.lab-pe-tl-row:hover { background: #f3f7ff; }
.lab-pe-tl-row.selected { background: #dde8ff; font-weight: bold; }
.lab-pe-tl-row.lineage { background: #f0f5ff; }
.lab-pe-tl-row.hidden { display: none; }
.lab-pe-tl-bar { position: absolute; top: 3px; height: 10px; min-width: 2px; border-radius: 2px; opacity: 0.85; }
.lab-pe-tl-swatch { display: inline-block; width: 8px; height: 8px; margin-right: 4px; border-radius: 2px; }
.lab-pe-detail { width: 320px; flex: none; padding: 6px; border-left: 1px solid #ddd; overflow-y: auto; max-height: 300px; box-sizing: border-box; }
.lab-pe-detail-title { overflow-wrap: anywhere; }
.lab-pe-detail table { border-collapse: collapse; table-layout: fixed; width: 100%; }
.lab-pe-detail td { vertical-align: top; padding: 1px 4px; overflow-wrap: anywhere; }
.lab-pe-detail td:first-child { width: 78px; }
.lab-pe-detail .lab-pe-field-text, .lab-pe-detail pre { white-space: pre-wrap; font: 11px monospace; margin: 0; }
.lab-pe-tip { position: absolute; pointer-events: none; background: #fffbe6; border: 1px solid #caa;
  padding: 3px 6px; max-width: 320px; z-index: 10; display: none; font-size: 11px; white-space: pre-line; }
`;

function h(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

// Cytoscape styles from Python's encoding (lab.provenance.view.NODE_ENCODING, BORDER_ENCODING): the
// legend is drawn from the same entries, so what a mark means is written once.
function styles(enc, big) {
  const types = (enc && enc.types) || {};
  const borders = (enc && enc.borders) || {};
  const trust = borders.trust || { color: "#d62728", color_high: "#2ca02c" };
  const s = [
    {
      selector: "node",
      style: {
        label: "data(label)",
        "font-size": 10,
        "text-wrap": "wrap",
        "text-max-width": 170,
        "text-halign": "right",
        "text-valign": "center",
        "text-justification": "left",
        "text-margin-x": 4,
        "text-background-color": "#fff", // edges pass behind the label, not through it
        "text-background-opacity": 0.75,
        "text-background-padding": 1,
        "min-zoomed-font-size": 5,
        width: 20,
        height: 20,
        "border-width": 3,
        "border-color": `mapData(trust, 0, 1, ${trust.color}, ${trust.color_high})`,
        "background-opacity": "mapData(trust, 0, 1, 0.35, 1)",
      },
    },
  ];
  for (const [type, st] of Object.entries(types)) s.push({ selector: `node[type = "${type}"]`, style: { shape: st.shape, "background-color": st.color } });
  s.push(
    { selector: "edge", style: { width: 1, "line-color": "#bbb", "target-arrow-color": "#bbb", "target-arrow-shape": "triangle", "curve-style": big ? "haystack" : "bezier", "arrow-scale": 0.6 } },
    { selector: 'edge[relation = "attributed_to"]', style: { "line-style": "dotted" } },
    { selector: 'edge[relation = "invalidated_by"]', style: { "line-color": "#d62728", "line-style": "dashed" } },
  );
  if (borders.ineligible) s.push({ selector: "node.ineligible", style: { "background-color": borders.ineligible.fill, "background-opacity": 0.5, "border-color": borders.ineligible.color, color: "#999" } });
  if (borders.invalid) s.push({ selector: "node.invalid", style: { "border-style": "dashed" } });
  for (const key of ["gate_block", "gate_allow", "gate_confirm"]) {
    if (borders[key]) s.push({ selector: `node.${key}`, style: { "border-style": "double", "border-width": 6, "border-color": borders[key].color } });
  }
  // marks that carry their own cytoscape style (e.g. a repair's deactivated / replayed / support-path marks)
  for (const [key, b] of Object.entries(borders)) {
    if (b.style) s.push({ selector: `node.${key}`, style: b.style });
    if (b.edge_style) s.push({ selector: `edge.${key}`, style: b.edge_style });
  }
  s.push(
    { selector: ".hidden", style: { display: "none" } },
    { selector: ".faded", style: { opacity: 0.25 } },
    { selector: "node.ancestor", style: { "overlay-color": "#1f77b4", "overlay-opacity": 0.35, "overlay-padding": 5 } },
    { selector: "node.descendant", style: { "overlay-color": "#ff7f0e", "overlay-opacity": 0.35, "overlay-padding": 5 } },
    { selector: "node.focus", style: { "overlay-color": "#000", "overlay-opacity": 0.3, "overlay-padding": 7 } },
    { selector: "node.match", style: { "underlay-color": "#ffd400", "underlay-opacity": 0.9, "underlay-padding": 7, "underlay-shape": "ellipse", "font-weight": "bold" } },
    { selector: "edge.lineage", style: { "line-color": "#555", "target-arrow-color": "#555", width: 2 } },
  );
  return s;
}

// A legend swatch: the type's shape in its colour, or a border mark (SVG, 22 x 16).
const SHAPES = {
  diamond: "11,1 21,8 11,15 1,8",
  hexagon: "5,1 17,1 21,8 17,15 5,15 1,8",
  rectangle: null,
  "round-rectangle": null,
  ellipse: null,
};
function swatch(entry) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", "22");
  svg.setAttribute("height", "16");
  const add = (tag, attrs) => {
    const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    svg.append(e);
    return e;
  };
  if (entry.kind === "type") {
    const fill = { fill: entry.color, stroke: "#555", "stroke-width": "1" };
    if (entry.shape === "ellipse") add("ellipse", { cx: 11, cy: 8, rx: 9, ry: 7, ...fill });
    else if (SHAPES[entry.shape]) add("polygon", { points: SHAPES[entry.shape], ...fill });
    else add("rect", { x: 2, y: 2, width: 18, height: 12, rx: entry.shape === "round-rectangle" ? 4 : 0, ...fill });
    svg.setAttribute("data-shape", entry.shape);
    return svg;
  }
  if (entry.key === "trust") {
    const grad = add("linearGradient", { id: `lab-pe-trust-${Math.random().toString(36).slice(2)}` });
    for (const [off, c] of [["0", entry.color], ["1", entry.color_high]]) {
      const stop = document.createElementNS(ns, "stop");
      stop.setAttribute("offset", off);
      stop.setAttribute("stop-color", c);
      grad.append(stop);
    }
    add("rect", { x: 1, y: 3, width: 20, height: 10, fill: `url(#${grad.getAttribute("id")})` });
    return svg;
  }
  const stroke = { fill: entry.fill || "#fff", stroke: entry.color, "stroke-width": entry.border === "double" ? "1.5" : "2.5" };
  if (entry.border === "dashed") stroke["stroke-dasharray"] = "3,2";
  add("rect", { x: 3, y: 3, width: 16, height: 10, ...stroke });
  if (entry.border === "double") add("rect", { x: 5.5, y: 5.5, width: 11, height: 5, fill: "none", stroke: entry.color, "stroke-width": "1.5" });
  return svg;
}

// Cheap layout for big graphs: x by time order, one horizontal lane per type.
function presetPositions(nodes, types) {
  const lane = Object.fromEntries(types.map((t, i) => [t, i]));
  const order = nodes.map((n, i) => [n.data.time, i]).sort((a, b) => a[0] - b[0]);
  const perRow = Math.max(1, Math.ceil(Math.sqrt(nodes.length)));
  const pos = new Array(nodes.length);
  const counts = {};
  for (const [, i] of order) {
    const t = nodes[i].data.type;
    const k = (counts[t] = (counts[t] || 0) + 1) - 1;
    pos[i] = { x: (k % perRow) * 40, y: lane[t] * (Math.ceil(nodes.length / perRow) * 12 + 120) + Math.floor(k / perRow) * 30 };
  }
  return pos;
}

function esc(s) {
  return String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
}

function renderDetail(box, d) {
  if (!d || !d.id) {
    box.innerHTML = "<i>Click a node, a timeline row or a search hit to see its details.</i>";
    return;
  }
  if (d.error) {
    box.innerHTML = `<b>${esc(d.id)}</b><div>${esc(d.error)}</div>`;
    return;
  }
  const attrs = d.attributes || {};
  const rows = [
    ["id", d.id],
    ["type", d.type],
  ];
  if (attrs.tool) {
    const args = attrs.arguments !== undefined ? attrs.arguments : attrs.input;
    rows.push(["tool", attrs.tool]);
    if (args !== undefined && args !== null) rows.push(["arguments", typeof args === "string" ? args : JSON.stringify(args, null, 1)]);
  }
  rows.push(
    ["text", d.text],
    ["owner", d.owner ?? ""],
    ["time", d.time_label || d.time],
    ["labels", (d.labels || []).join(", ") || "(public)"],
    ["trust", d.trust],
    ["valid", d.valid],
  );
  if (d.eligible !== null && d.eligible !== undefined) rows.push(["readable", d.eligible ? `yes, by ${d.agent}` : `no, by ${d.agent}: ${d.reason}`]);
  rows.push(["parents", (d.parents || []).join(", ")], ["children", (d.children || []).join(", ")]);
  if (d.gate) rows.push(["gate", `${d.gate.decision} (${d.gate.risk})`], ["gate reasons", (d.gate.reasons || []).join("; ")]);
  box.innerHTML =
    `<div class="lab-pe-detail-title"><b>${esc(d.id)}</b></div><table>` +
    rows
      .map(([k, v]) => {
        const cls = `lab-pe-field-${esc(k.split(" ")[0])}`;
        const body = k === "arguments" ? `<pre class="${cls}">${esc(v)}</pre>` : `<div class="${cls}">${esc(v)}</div>`;
        return `<tr><td><b>${esc(k)}</b></td><td>${body}</td></tr>`;
      })
      .join("") +
    "</table>";
}

function render({ model, el }) {
  el.append(h("style", {}, CSS));
  // side panel: title and counter, search, filters, legend (rebuilt with the elements)
  const title = h("div", { class: "lab-pe-title" });
  const count = h("div", { class: "lab-pe-count" });
  const search = h("input", { type: "search", class: "lab-pe-search", placeholder: "search id or text (Enter: select)", "aria-label": "search nodes by id or text" });
  const hitsCount = h("div", { class: "lab-pe-hits-count" });
  const hitsBox = h("div", { class: "lab-pe-hits" });
  const filtersBox = h("div", { class: "lab-pe-filters" });
  const legendBox = h("fieldset", { class: "lab-pe-legend" }, h("legend", {}, "legend"));
  const side = h("div", { class: "lab-pe-side" }, title, count, search, hitsCount, hitsBox, filtersBox, legendBox);
  const cyBox = h("div", { class: "lab-pe-cy" });
  const tip = h("div", { class: "lab-pe-tip" });
  cyBox.append(tip);
  const timeInput = h("input", { type: "range", min: "0", max: "1", step: "any", value: "1", class: "lab-pe-time-input", "aria-label": "show the nodes up to this time" });
  const timeLabel = h("span", { class: "lab-pe-time-label" });
  const timeBar = h("div", { class: "lab-pe-time" }, "time", timeInput, timeLabel);
  const timelineBox = h("div", { class: "lab-pe-timeline" });
  const detail = h("div", { class: "lab-pe-detail" });
  // the graph takes the whole width beside the side panel; the timeline and the detail panel share the row below
  const root = h("div", { class: "lab-pe" }, side, h("div", { class: "lab-pe-main" }, cyBox, timeBar, h("div", { class: "lab-pe-bottom" }, timelineBox, detail)));
  el.append(root);

  let cy = null;
  let boxes = {}; // facet -> value -> checkbox
  let rowsById = new Map(); // timeline row element per node id

  function facetValues() {
    const out = {};
    for (const [facet, vals] of Object.entries(boxes)) out[facet] = Object.entries(vals).filter(([, cb]) => cb.checked).map(([v]) => v);
    return out;
  }

  function select(id) {
    model.set("selected", id);
    model.save_changes(); // Python answers with `highlight` and `detail`
  }

  let tipNode = null; // the node the tooltip is about

  function hideTip() {
    tip.style.display = "none";
    tipNode = null;
  }

  // Python's `visible` ids are shown, every other node (and its timeline row) gets the `hidden` class
  // (display: none, so it is neither drawn nor hit by clicks and hovers); an open tooltip of a hidden
  // node closes. The counter and the legend's numbers are Python's too.
  function applyVisible() {
    const shown = new Set(model.get("visible") || []);
    if (cy) cy.batch(() => cy.nodes().forEach((n) => n.toggleClass("hidden", !shown.has(n.id()))));
    for (const [id, row] of rowsById) row.classList.toggle("hidden", !shown.has(id));
    for (const hit of hitsBox.querySelectorAll(".lab-pe-hit")) hit.classList.toggle("hidden-node", !shown.has(hit.dataset.id));
    if (tipNode && !shown.has(tipNode)) hideTip();
  }

  function drawCounter() {
    count.textContent = (model.get("counter") || {}).text || "";
  }

  function drawLegend() {
    legendBox.querySelectorAll(".lab-pe-legend-entry").forEach((e) => e.remove());
    for (const entry of model.get("legend") || []) {
      const row = h("div", { class: `lab-pe-legend-entry${entry.shown ? "" : " none-shown"}`, "data-kind": entry.kind, "data-key": entry.key, title: entry.meaning });
      row.append(swatch(entry), h("span", {}, entry.kind === "type" ? entry.key : entry.meaning), h("span", { class: "n" }, `${entry.shown}/${entry.count}`));
      legendBox.append(row);
    }
  }

  function buildFilters(els) {
    title.innerHTML = "";
    title.append(h("b", {}, `${els.nodes.length} nodes, ${els.edges.length} edges`));
    if (els.run) title.append(h("div", {}, `run ${els.run}`));
    if (els.truncated) title.append(h("div", {}, `(of ${els.total}: truncated)`));
    if (els.agent) title.append(h("div", {}, `eligibility for ${els.agent}`));
    filtersBox.innerHTML = "";
    boxes = {};
    const f = model.get("filters") || {};
    for (const facet of ["types", "agents", "scopes"]) {
      const fs = h("fieldset", { class: `lab-pe-filter-${facet}` }, h("legend", {}, facet));
      boxes[facet] = {};
      const chosen = Array.isArray(f[facet]) ? new Set(f[facet]) : null;
      for (const v of els[facet] || []) {
        const cb = h("input", { type: "checkbox", value: v });
        cb.checked = !chosen || chosen.has(v);
        cb.addEventListener("change", () => {
          model.set("filters", facetValues());
          model.save_changes(); // Python answers with `visible`
        });
        boxes[facet][v] = cb;
        fs.append(h("label", { title: v }, cb, " ", v || "(none)"));
      }
      filtersBox.append(fs);
    }
  }

  function syncFilterBoxes() {
    const f = model.get("filters") || {};
    for (const [facet, vals] of Object.entries(boxes)) {
      const chosen = Array.isArray(f[facet]) ? new Set(f[facet]) : null;
      for (const [v, cb] of Object.entries(vals)) cb.checked = !chosen || chosen.has(v);
    }
  }

  function syncTime() {
    const els = model.get("elements") || {};
    const axis = els.time_axis || {};
    const [lo, hi] = els.time_range || [0, 0];
    timeInput.min = String(lo);
    timeInput.max = String(hi);
    timeInput.step = axis.step ? String(axis.step) : "any"; // whole messages, or continuous seconds
    timeInput.title = axis.name || "";
    const tmax = model.get("time_max");
    timeInput.value = String(tmax === null || tmax === undefined ? hi : tmax);
  }

  function drawTimeLabel() {
    timeLabel.textContent = model.get("time_label") || "";
    timeLabel.title = ((model.get("elements") || {}).time_axis || {}).name || "";
  }

  function drawTimeline() {
    const tl = model.get("timeline") || { rows: [], axis: {} };
    const colors = (((model.get("elements") || {}).encoding || {}).types) || {};
    timelineBox.innerHTML = "";
    rowsById = new Map();
    const axis = tl.axis || {};
    const ticks = h("div", { class: "lab-pe-tl-track" });
    for (const t of axis.ticks || []) {
      const tick = h("div", { class: "lab-pe-tl-tick" }, t.label);
      tick.style.left = `${t.at * 100}%`;
      ticks.append(tick);
    }
    const head = h("div", { class: "lab-pe-tl-head" }, h("div", { class: "lab-pe-tl-name" }, h("b", {}, `steps (${(tl.rows || []).length})`), h("div", { class: "lab-pe-tl-unit" }, axis.name || "")), ticks);
    timelineBox.append(head);
    for (const r of tl.rows || []) {
      const color = (colors[r.type] || {}).color || "#888";
      const name = h("div", { class: "lab-pe-tl-name", title: `${r.label}\n${r.id}` }, h("span", { class: "lab-pe-tl-swatch" }), r.label);
      name.style.paddingLeft = `${4 + 12 * r.depth}px`;
      name.firstChild.style.background = color;
      const bar = h("div", { class: "lab-pe-tl-bar", title: `${r.start_label}, ${r.duration_label} (until: ${r.until})` });
      bar.style.left = `${r.left * 100}%`;
      bar.style.width = `${r.width * 100}%`;
      bar.style.background = color;
      const row = h("div", { class: "lab-pe-tl-row", "data-id": r.id, "data-depth": String(r.depth), tabindex: "0", role: "button" }, name, h("div", { class: "lab-pe-tl-track" }, bar));
      row.addEventListener("click", () => select(r.id));
      row.addEventListener("keydown", (evt) => {
        if (evt.key === "Enter" || evt.key === " ") {
          evt.preventDefault();
          select(r.id);
        }
      });
      row.addEventListener("mouseenter", () => cy && cy.$id(r.id).addClass("match-hover"));
      row.addEventListener("mouseleave", () => cy && cy.$id(r.id).removeClass("match-hover"));
      rowsById.set(r.id, row);
      timelineBox.append(row);
    }
  }

  function drawHits() {
    const res = model.get("hits") || {};
    hitsBox.innerHTML = "";
    const hits = res.hits || [];
    hitsCount.textContent = res.query ? `${res.total} match${res.total === 1 ? "" : "es"} for “${res.query}”` + (res.total > hits.length ? ` (first ${hits.length})` : "") : "";
    const label = new Map(((model.get("elements") || {}).nodes || []).map((n) => [n.data.id, n.data.label]));
    for (const hit of hits) {
      const where = hit.field === "label" || hit.field === "id" ? hit.id : `${hit.field}: ${hit.snippet}`;
      const item = h("div", { class: "lab-pe-hit", "data-id": hit.id, "data-field": hit.field, title: hit.id }, String(label.get(hit.id) || hit.id).split("\n").join(" · "), h("small", {}, where));
      item.addEventListener("click", () => select(hit.id));
      hitsBox.append(item);
    }
    if (cy) {
      const ids = new Set(hits.map((x) => x.id));
      cy.batch(() => cy.nodes().forEach((n) => n.toggleClass("match", ids.has(n.id()))));
    }
    applyVisible();
    markSelected();
  }

  let searchTimer = null;
  search.addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => {
      model.set("query", search.value);
      model.save_changes(); // Python answers with `hits`
    }, 120);
  });
  let pendingEnter = false; // Enter pressed before Python answered the query typed: select its first hit then
  search.addEventListener("keydown", (evt) => {
    if (evt.key !== "Enter") return;
    evt.preventDefault();
    const res = model.get("hits") || {};
    const typed = search.value.trim().split(/\s+/).join(" ").toLowerCase(); // as lab.provenance.view.search reads it
    if ((res.query || "") === typed) {
      if (res.hits && res.hits.length) select(res.hits[0].id);
      return;
    }
    clearTimeout(searchTimer);
    pendingEnter = true;
    model.set("query", search.value);
    model.save_changes();
  });

  function markSelected() {
    const sel = model.get("selected");
    const hl = model.get("highlight") || {};
    const lineage = new Set([...(hl.ancestors || []), ...(hl.descendants || [])]);
    for (const [id, row] of rowsById) {
      row.classList.toggle("selected", id === sel);
      row.classList.toggle("lineage", !!sel && lineage.has(id));
    }
    for (const hit of hitsBox.querySelectorAll(".lab-pe-hit")) hit.classList.toggle("selected", hit.dataset.id === sel);
    const row = rowsById.get(sel);
    if (row && !row.classList.contains("hidden")) {
      // scroll the timeline (only it, not the page) so that the selected row is in view
      const top = row.offsetTop - timelineBox.offsetTop;
      const head = timelineBox.firstChild ? timelineBox.firstChild.offsetHeight : 0;
      if (top < timelineBox.scrollTop + head || top + row.offsetHeight > timelineBox.scrollTop + timelineBox.clientHeight) {
        timelineBox.scrollTop = Math.max(0, top - head - timelineBox.clientHeight / 3);
      }
    }
  }

  function applyHighlight() {
    markSelected();
    if (!cy) return;
    const hl = model.get("highlight") || {};
    const sel = model.get("selected");
    cy.batch(() => {
      cy.elements().removeClass("ancestor descendant focus faded lineage");
      if (!sel) return;
      const anc = new Set(hl.ancestors || []);
      const desc = new Set(hl.descendants || []);
      cy.nodes().forEach((n) => {
        const id = n.id();
        if (id === sel) n.addClass("focus");
        else if (anc.has(id)) n.addClass("ancestor");
        else if (desc.has(id)) n.addClass("descendant");
        else n.addClass("faded");
      });
      const inSet = (id) => id === sel || anc.has(id) || desc.has(id);
      cy.edges().forEach((e) => {
        if (inSet(e.data("source")) && inSet(e.data("target"))) e.addClass("lineage");
        else e.addClass("faded");
      });
    });
    // a node selected elsewhere (timeline, search) that lies outside the view: bring it in
    const node = sel ? cy.$id(sel) : null;
    if (node && node.nonempty() && node.visible()) {
      const ext = cy.extent();
      const p = node.position();
      if (p.x < ext.x1 || p.x > ext.x2 || p.y < ext.y1 || p.y > ext.y2) cy.center(node);
    }
  }

  // Test hook: every live explorer's cytoscape instance, while its view lives (see README.md).
  const registry = (window.__labExplorers = window.__labExplorers || []);
  function register(next, prev) {
    const i = prev ? registry.indexOf(prev) : -1;
    if (i >= 0) registry.splice(i, 1);
    if (next) registry.push(next);
    el.__cy = next || undefined;
  }

  function build() {
    const els = model.get("elements") || { nodes: [], edges: [] };
    const prev = cy;
    if (cy) cy.destroy();
    hideTip();
    const big = els.nodes.length > DAGRE_MAX;
    let layout;
    const nodes = els.nodes.map((n) => ({ data: n.data, classes: (n.data.marks || []).join(" ") }));
    if (big) {
      const pos = presetPositions(els.nodes, els.types || []);
      nodes.forEach((n, i) => (n.position = pos[i]));
      layout = { name: "preset", fit: true };
    } else {
      layout = { name: "dagre", rankDir: "LR", nodeSep: 14, rankSep: 190, fit: true, padding: 20 }; // labels right of their node: rankSep leaves room for them
    }
    const style = styles(els.encoding, big);
    style.push({ selector: "node.match-hover", style: { "underlay-color": "#1f77b4", "underlay-opacity": 0.5, "underlay-padding": 8 } });
    cy = cytoscape({
      container: cyBox,
      elements: { nodes, edges: els.edges.map((e) => ({ data: e.data, classes: (e.data.marks || []).join(" ") })) },
      style,
      layout,
      wheelSensitivity: 0.3,
      textureOnViewport: big,
      hideEdgesOnViewport: big,
      pixelRatio: big ? 1 : "auto",
      boxSelectionEnabled: false,
    });
    register(cy, prev);
    stale = true;
    cy.on("tap", "node", (evt) => select(evt.target.id()));
    cy.on("tap", (evt) => {
      if (evt.target === cy) select("");
    });
    cy.on("mouseover", "node", (evt) => {
      const d = evt.target.data();
      const p = evt.renderedPosition || evt.target.renderedPosition();
      const row = (model.get("timeline") || { rows: [] }).rows.find((r) => r.id === d.id);
      let html = `<b>${esc(d.label)}</b>\n${esc(d.id)} (${esc(d.type)})${row ? `, ${esc(row.start_label)}` : ""}\npath trust ${d.trust}`;
      if (!d.eligible) html += `\nnot readable: ${esc(d.reason)}`;
      if (d.gate) html += `\ngate: ${esc(d.gate)}`;
      tip.innerHTML = html;
      tip.style.display = "block";
      // beside the pointer, on the side where it fits inside the graph's box
      const left = p.x + 12 + tip.offsetWidth > cyBox.clientWidth ? Math.max(0, p.x - 12 - tip.offsetWidth) : p.x + 12;
      const top = p.y + 12 + tip.offsetHeight > cyBox.clientHeight ? Math.max(0, p.y - 12 - tip.offsetHeight) : p.y + 12;
      tip.style.left = `${left}px`;
      tip.style.top = `${top}px`;
      tipNode = d.id;
    });
    cy.on("mouseout", "node", hideTip);
    buildFilters(els);
    syncTime();
    drawTimeLabel();
    drawTimeline();
    drawLegend();
    drawCounter();
    drawHits();
    applyVisible();
    applyHighlight();
  }

  let timer = null;
  timeInput.addEventListener("input", () => {
    const v = parseFloat(timeInput.value);
    const hi = parseFloat(timeInput.max);
    model.set("time_max", v >= hi ? null : v);
    clearTimeout(timer);
    timer = setTimeout(() => model.save_changes(), 100); // Python answers with `visible` and `time_label`
  });

  const onElements = () => build();
  const onFilters = () => syncFilterBoxes();
  const onTime = () => syncTime();
  const onVisible = () => applyVisible();
  const onHighlight = () => applyHighlight();
  const onDetail = () => renderDetail(detail, model.get("detail"));
  const onHits = () => {
    drawHits();
    const res = model.get("hits") || {};
    if (pendingEnter) {
      pendingEnter = false;
      if (res.hits && res.hits.length) select(res.hits[0].id);
    }
  };
  const onQuery = () => {
    if (document.activeElement !== search) search.value = model.get("query") || "";
  };
  const handlers = {
    "change:elements": onElements,
    "change:filters": onFilters,
    "change:time_max": onTime,
    "change:time_label": drawTimeLabel,
    "change:visible": onVisible,
    "change:legend": drawLegend,
    "change:counter": drawCounter,
    "change:highlight": onHighlight,
    "change:selected": onHighlight,
    "change:detail": onDetail,
    "change:hits": onHits,
    "change:query": onQuery,
    "change:timeline": () => {
      drawTimeline();
      applyVisible();
      markSelected();
    },
  };
  for (const [ev, fn] of Object.entries(handlers)) model.on(ev, fn);

  // Where the container is on screen. cytoscape caches its container's client rectangle for pointer
  // events and drops it only on scrolls of the ancestors the container had when cytoscape started,
  // on window resizes and on its own cy.resize(). An anywidget view is rendered before it is attached
  // to the page, so the element that scrolls it (JupyterLab's notebook panel, Voila's page) is not among
  // them: after a scroll, clicks and hovers would land where the container was. So any scroll in the
  // page, a resize or visibility change of the container and the pointer entering it mark the cached
  // rectangle stale, and the next pointer event inside the container first calls cy.resize() (which
  // reads it afresh), before cytoscape's own listeners run.
  let stale = true;
  const abort = new AbortController();
  const opts = { capture: true, passive: true, signal: abort.signal };
  const markStale = () => (stale = true);
  const refresh = () => {
    if (stale && cy) {
      stale = false;
      cy.resize();
    }
  };
  document.addEventListener("scroll", markStale, opts); // scroll events do not bubble, but are captured
  window.addEventListener("resize", markStale, opts);
  cyBox.addEventListener("mouseover", () => (markStale(), refresh()), opts); // entering: it may have moved
  for (const type of ["mousemove", "mousedown", "wheel", "touchstart", "pointerdown"]) cyBox.addEventListener(type, refresh, opts);

  search.value = model.get("query") || "";
  build();
  renderDetail(detail, model.get("detail"));
  // Sized (the element may be attached and sized after render): resize, and fit the first time.
  const ro = new ResizeObserver(() => {
    if (cy && cyBox.clientWidth > 0) {
      const first = !cyBox.__sized;
      cyBox.__sized = true;
      stale = false;
      cy.resize();
      if (first) cy.fit(undefined, 20);
    }
  });
  ro.observe(cyBox);
  // Shown or moved into or out of the viewport (a tab or a collapsed output shown, the page scrolled).
  const io = new IntersectionObserver(() => {
    markStale();
    if (cyBox.clientWidth > 0) refresh();
  });
  io.observe(cyBox);

  return () => {
    abort.abort();
    ro.disconnect();
    io.disconnect();
    clearTimeout(timer);
    clearTimeout(searchTimer);
    for (const [ev, fn] of Object.entries(handlers)) model.off(ev, fn);
    if (cy) cy.destroy();
    register(null, cy);
    cy = null;
  };
}

export default { render };
