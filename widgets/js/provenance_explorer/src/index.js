// Front end of widgets.ProvenanceExplorer (anywidget). Draws what Python computed
// (lab.provenance.view) and sends back user input: `selected` (node click), `filters`
// (checkboxes), `time_max` (time scrubber). Which nodes are shown is Python's answer too
// (`visible`, from lab.provenance.view.visible_ids): this file only toggles classes from it.
import cytoscape from "cytoscape";
import dagre from "cytoscape-dagre";

cytoscape.use(dagre);

const DAGRE_MAX = 800; // above this many nodes: a cheap preset layout instead of dagre

const TYPE_STYLE = {
  agent: { shape: "diamond", color: "#6a3d9a" },
  source: { shape: "round-rectangle", color: "#1f77b4" },
  memory: { shape: "ellipse", color: "#17becf" },
  claim: { shape: "hexagon", color: "#ff7f0e" },
  action: { shape: "rectangle", color: "#d62728" },
};

const CSS = `
.lab-pe { display: flex; font: 12px sans-serif; border: 1px solid #ddd; }
.lab-pe-side { width: 230px; padding: 6px; border-right: 1px solid #ddd; overflow-y: auto; max-height: 560px; }
.lab-pe-side fieldset { border: 1px solid #eee; margin: 0 0 6px 0; padding: 2px 6px; }
.lab-pe-side legend { font-weight: bold; }
.lab-pe-count { color: #555; margin: 2px 0 4px 0; }
.lab-pe-side label { display: block; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.lab-pe-main { flex: 1; display: flex; flex-direction: column; min-width: 0; }
.lab-pe-cy { height: 500px; width: 100%; position: relative; }
.lab-pe-time { padding: 4px 8px; border-top: 1px solid #eee; display: flex; gap: 8px; align-items: center; }
.lab-pe-time input { flex: 1; }
.lab-pe-detail { width: 260px; padding: 6px; border-left: 1px solid #ddd; overflow-y: auto; max-height: 560px; word-break: break-word; }
.lab-pe-detail table { border-collapse: collapse; }
.lab-pe-detail td { vertical-align: top; padding: 1px 4px; }
.lab-pe-tip { position: absolute; pointer-events: none; background: #fffbe6; border: 1px solid #caa;
  padding: 3px 6px; max-width: 320px; z-index: 10; display: none; font-size: 11px; }
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

function styles() {
  const s = [
    {
      selector: "node",
      style: {
        label: "data(label)",
        "font-size": 9,
        "text-valign": "bottom",
        "text-margin-y": 2,
        "min-zoomed-font-size": 7,
        width: 22,
        height: 22,
        // trust as border colour: red (0) .. green (1), and as fill intensity
        "border-width": 3,
        "border-color": "mapData(trust, 0, 1, #d62728, #2ca02c)",
        "background-opacity": "mapData(trust, 0, 1, 0.35, 1)",
      },
    },
    { selector: "edge", style: { width: 1, "line-color": "#bbb", "target-arrow-color": "#bbb", "target-arrow-shape": "triangle", "curve-style": "haystack", "arrow-scale": 0.6 } },
    { selector: 'edge[relation = "attributed_to"]', style: { "line-style": "dotted" } },
    { selector: 'edge[relation = "invalidated_by"]', style: { "line-color": "#d62728", "line-style": "dashed" } },
    { selector: "node.ineligible", style: { "background-color": "#ccc", "background-opacity": 0.5, "border-color": "#999", color: "#999" } },
    { selector: "node[?valid]", style: {} },
    { selector: "node[!valid]", style: { "border-style": "dashed" } },
    { selector: 'node[gate = "block"]', style: { "border-style": "double", "border-width": 6, "border-color": "#b00" } },
    { selector: 'node[gate = "allow"]', style: { "border-style": "double", "border-width": 6, "border-color": "#080" } },
    { selector: 'node[gate = "confirm"], node[gate = "verify"]', style: { "border-style": "double", "border-width": 6, "border-color": "#e90" } },
    { selector: ".hidden", style: { display: "none" } },
    { selector: ".faded", style: { opacity: 0.25 } },
    { selector: "node.ancestor", style: { "overlay-color": "#1f77b4", "overlay-opacity": 0.35, "overlay-padding": 5 } },
    { selector: "node.descendant", style: { "overlay-color": "#ff7f0e", "overlay-opacity": 0.35, "overlay-padding": 5 } },
    { selector: "node.focus", style: { "overlay-color": "#000", "overlay-opacity": 0.3, "overlay-padding": 7 } },
    { selector: "edge.lineage", style: { "line-color": "#555", "target-arrow-color": "#555", width: 2 } },
  ];
  for (const [type, st] of Object.entries(TYPE_STYLE)) {
    s.splice(1, 0, { selector: `node[type = "${type}"]`, style: { shape: st.shape, "background-color": st.color } });
  }
  return s;
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
    box.innerHTML = "<i>Click a node to see its details.</i>";
    return;
  }
  if (d.error) {
    box.innerHTML = `<b>${esc(d.id)}</b><div>${esc(d.error)}</div>`;
    return;
  }
  const rows = [
    ["id", d.id],
    ["type", d.type],
    ["text", d.text],
    ["owner", d.owner ?? ""],
    ["time", d.time],
    ["labels", (d.labels || []).join(", ") || "(public)"],
    ["trust", d.trust],
    ["valid", d.valid],
  ];
  if (d.eligible !== null && d.eligible !== undefined) rows.push([`readable by ${d.agent}`, d.eligible ? "yes" : `no: ${d.reason}`]);
  rows.push(["parents", (d.parents || []).join(", ")], ["children", (d.children || []).join(", ")]);
  if (d.gate) rows.push(["gate", `${d.gate.decision} (${d.gate.risk})`], ["gate reasons", (d.gate.reasons || []).join("; ")]);
  box.innerHTML =
    `<div class="lab-pe-detail-title"><b>${esc(d.id)}</b></div><table>` +
    rows.map(([k, v]) => `<tr><td><b>${esc(k)}</b></td><td class="lab-pe-${esc(k.split(" ")[0])}">${esc(v)}</td></tr>`).join("") +
    "</table>";
}

function render({ model, el }) {
  el.append(h("style", {}, CSS));
  const side = h("div", { class: "lab-pe-side" });
  const cyBox = h("div", { class: "lab-pe-cy" });
  const tip = h("div", { class: "lab-pe-tip" });
  cyBox.append(tip);
  const timeInput = h("input", { type: "range", min: "0", max: "1", step: "any", value: "1", class: "lab-pe-time-input" });
  const timeLabel = h("span", { class: "lab-pe-time-label" });
  const timeBar = h("div", { class: "lab-pe-time" }, "time ≤", timeInput, timeLabel);
  const detail = h("div", { class: "lab-pe-detail" });
  const root = h("div", { class: "lab-pe" }, side, h("div", { class: "lab-pe-main" }, cyBox, timeBar), detail);
  el.append(root);

  let cy = null;
  let boxes = {}; // facet -> value -> checkbox
  let count = null; // "N of M nodes shown"

  function facetValues() {
    const out = {};
    for (const [facet, vals] of Object.entries(boxes)) out[facet] = Object.entries(vals).filter(([, cb]) => cb.checked).map(([v]) => v);
    return out;
  }

  let tipNode = null; // the node the tooltip is about

  function hideTip() {
    tip.style.display = "none";
    tipNode = null;
  }

  // Python's `visible` ids are shown, every other node gets the `hidden` class (display: none,
  // so it is neither drawn nor hit by clicks and hovers); an open tooltip of a hidden node closes.
  function applyVisible() {
    if (!cy) return;
    const shown = new Set(model.get("visible") || []);
    cy.batch(() => cy.nodes().forEach((n) => n.toggleClass("hidden", !shown.has(n.id()))));
    if (tipNode && !shown.has(tipNode)) hideTip();
    if (count) count.textContent = `${cy.nodes().filter((n) => !n.hasClass("hidden")).length} of ${cy.nodes().length} nodes shown`;
  }

  function buildFilters(els) {
    side.innerHTML = "";
    boxes = {};
    const f = model.get("filters") || {};
    const title = h("div", {}, h("b", {}, `${els.nodes.length} nodes, ${els.edges.length} edges`));
    if (els.truncated) title.append(h("div", {}, `(of ${els.total}: truncated)`));
    if (els.agent) title.append(h("div", {}, `eligibility for ${els.agent}`));
    count = h("div", { class: "lab-pe-count" });
    title.append(count);
    side.append(title);
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
        fs.append(h("label", {}, cb, " ", v || "(none)"));
      }
      side.append(fs);
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
    const [lo, hi] = els.time_range || [0, 0];
    timeInput.min = String(lo);
    timeInput.max = String(hi);
    timeInput.step = hi > lo ? String((hi - lo) / 1000) : "any";
    const tmax = model.get("time_max");
    timeInput.value = String(tmax === null || tmax === undefined ? hi : tmax);
    timeLabel.textContent = tmax === null || tmax === undefined ? "all" : String(Math.round(tmax * 100) / 100);
  }

  function applyHighlight() {
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
    const nodes = els.nodes.map((n) => ({ data: n.data, classes: n.data.eligible ? "" : "ineligible" }));
    if (big) {
      const pos = presetPositions(els.nodes, els.types || []);
      nodes.forEach((n, i) => (n.position = pos[i]));
      layout = { name: "preset", fit: true };
    } else {
      layout = { name: "dagre", rankDir: "LR", nodeSep: 12, rankSep: 50, fit: true, padding: 20 };
    }
    cy = cytoscape({
      container: cyBox,
      elements: { nodes, edges: els.edges },
      style: styles(),
      layout,
      wheelSensitivity: 0.3,
      textureOnViewport: big,
      hideEdgesOnViewport: big,
      pixelRatio: big ? 1 : "auto",
      boxSelectionEnabled: false,
    });
    register(cy, prev);
    stale = true;
    cy.on("tap", "node", (evt) => {
      model.set("selected", evt.target.id());
      model.save_changes();
    });
    cy.on("tap", (evt) => {
      if (evt.target === cy) {
        model.set("selected", "");
        model.save_changes();
      }
    });
    cy.on("mouseover", "node", (evt) => {
      const d = evt.target.data();
      const p = evt.renderedPosition || evt.target.renderedPosition();
      let html = `<b>${esc(d.id)}</b> (${esc(d.type)}) trust ${d.trust}`;
      if (!d.eligible) html += `<br>not eligible: ${esc(d.reason)}`;
      if (d.gate) html += `<br>gate: ${esc(d.gate)}`;
      tip.innerHTML = html;
      tip.style.left = `${p.x + 12}px`;
      tip.style.top = `${p.y + 12}px`;
      tip.style.display = "block";
      tipNode = d.id;
    });
    cy.on("mouseout", "node", hideTip);
    buildFilters(els);
    syncTime();
    applyVisible();
    applyHighlight();
  }

  let timer = null;
  timeInput.addEventListener("input", () => {
    const v = parseFloat(timeInput.value);
    const hi = parseFloat(timeInput.max);
    model.set("time_max", v >= hi ? null : v);
    timeLabel.textContent = v >= hi ? "all" : String(Math.round(v * 100) / 100);
    clearTimeout(timer);
    timer = setTimeout(() => model.save_changes(), 150); // Python answers with `visible`
  });

  const onElements = () => build();
  const onFilters = () => syncFilterBoxes();
  const onTime = () => syncTime();
  const onVisible = () => applyVisible();
  const onHighlight = () => applyHighlight();
  const onDetail = () => renderDetail(detail, model.get("detail"));
  model.on("change:elements", onElements);
  model.on("change:filters", onFilters);
  model.on("change:time_max", onTime);
  model.on("change:visible", onVisible);
  model.on("change:highlight", onHighlight);
  model.on("change:selected", onHighlight);
  model.on("change:detail", onDetail);

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
    model.off("change:elements", onElements);
    model.off("change:filters", onFilters);
    model.off("change:time_max", onTime);
    model.off("change:visible", onVisible);
    model.off("change:highlight", onHighlight);
    model.off("change:selected", onHighlight);
    model.off("change:detail", onDetail);
    if (cy) cy.destroy();
    register(null, cy);
    cy = null;
  };
}

export default { render };
