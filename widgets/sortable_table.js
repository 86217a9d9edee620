// SortableTable: draws the table held in the model's `table` trait (lab.hpc.views.Table.to_json()).
// Click a header to sort by it (again: the other way); the select filters by the rows' group (e.g. the
// job state), the text box by any cell's text. Sort keys come with the data (computed in lab), so
// durations sort as durations and unknowns go last either way: the rule of Table.view in Python.
// The sort and the filters are traits too, so they survive every redraw the kernel sends.

function compareKey(v, descending) {
  if (v === null || v === undefined || (typeof v === "number" && Number.isNaN(v))) return [2, 0];
  if (typeof v === "string") return [1, v.toLocaleLowerCase()];
  return [0, descending ? -v : v];
}

function cmp(a, b) {
  if (a[0] !== b[0]) return a[0] - b[0];
  if (a[1] < b[1]) return -1;
  if (a[1] > b[1]) return 1;
  return 0;
}

export default {
  render({ model, el }) {
    el.classList.add("lab-sortable-table");
    const caption = document.createElement("div");
    caption.className = "lab-table-caption";
    const tools = document.createElement("div");
    tools.className = "lab-table-tools";
    const group = document.createElement("select");
    group.className = "lab-table-group";
    const text = document.createElement("input");
    text.type = "search";
    text.className = "lab-table-text";
    text.placeholder = "filter: any text";
    const count = document.createElement("span");
    count.className = "lab-table-count";
    tools.append(group, text, count);
    const scroll = document.createElement("div");
    scroll.className = "lab-table-scroll";
    const message = document.createElement("div");
    message.className = "lab-empty";
    el.append(caption, tools, scroll, message);

    const draw = () => {
      const t = model.get("table") || {};
      const columns = t.columns || [];
      const rows = t.rows || [];
      const sort = model.get("sort") || {};
      const wantGroup = model.get("group_filter") || "";
      const needle = (model.get("text_filter") || "").trim().toLocaleLowerCase();
      scroll.style.maxHeight = `${model.get("max_height") || 320}px`;
      caption.textContent = t.caption || "";
      caption.style.display = t.caption ? "" : "none";
      // the group filter's options: every group the table knows, plus the current choice
      const groups = Array.from(new Set([...(t.groups || []), ...rows.map((r) => r.group), ...(wantGroup ? [wantGroup] : [])]));
      const options = ["", ...groups];
      if (group.options.length !== options.length || options.some((g, i) => group.options[i].value !== g)) {
        group.replaceChildren(...options.map((g) => {
          const o = document.createElement("option");
          o.value = g;
          o.textContent = g ? g : `every ${t.group_label || "row"}`;
          return o;
        }));
      }
      group.value = wantGroup;
      if (document.activeElement !== text) text.value = model.get("text_filter") || "";
      let shown = rows.filter((r) => (!wantGroup || r.group === wantGroup) &&
        (!needle || r.cells.some((c) => String(c).toLocaleLowerCase().includes(needle))));
      const k = columns.findIndex((c) => c.key === sort.key);
      if (k >= 0) {
        shown = shown.map((r, i) => [r, i]);
        shown.sort((a, b) => cmp(compareKey(a[0].sort[k], !!sort.descending), compareKey(b[0].sort[k], !!sort.descending)) || a[1] - b[1]);
        shown = shown.map(([r]) => r);
      }
      count.textContent = rows.length ? `${shown.length} of ${rows.length} rows` : "";
      tools.style.display = rows.length ? "" : "none";
      if (!shown.length) {
        scroll.replaceChildren();
        message.textContent = rows.length ? "no row matches the filter" : (t.empty || "nothing to show");
        message.style.display = "";
        return;
      }
      message.style.display = "none";
      const table = document.createElement("table");
      table.className = "lab-table";
      const head = table.createTHead().insertRow();
      columns.forEach((c, i) => {
        const th = document.createElement("th");
        th.dataset.key = c.key;
        th.title = (c.help ? c.help + ". " : "") + "Click to sort";
        const arrow = i === k ? (sort.descending ? " \u25bc" : " \u25b2") : "";
        th.textContent = c.label + arrow;
        if (i === k) th.setAttribute("aria-sort", sort.descending ? "descending" : "ascending");
        if (c.numeric) th.classList.add("lab-num");
        th.addEventListener("click", () => {
          const same = (model.get("sort") || {}).key === c.key;
          model.set("sort", { key: c.key, descending: same ? !(model.get("sort") || {}).descending : false });
          model.save_changes();
        });
        head.appendChild(th);
      });
      const body = table.createTBody();
      for (const r of shown) {
        const tr = body.insertRow();
        tr.dataset.id = r.id;
        tr.dataset.group = r.group;
        if (r.muted) tr.classList.add("lab-muted");
        r.cells.forEach((c, i) => {
          const td = tr.insertCell();
          td.textContent = c;
          const s = r.sort[i];
          if (s !== null && s !== undefined) td.dataset.sort = String(s);
          if (columns[i] && columns[i].numeric) td.classList.add("lab-num");
        });
      }
      scroll.replaceChildren(table);
    };

    group.addEventListener("change", () => { model.set("group_filter", group.value); model.save_changes(); });
    text.addEventListener("input", () => { model.set("text_filter", text.value); model.save_changes(); });
    const events = ["change:table", "change:sort", "change:group_filter", "change:text_filter"];
    events.forEach((e) => model.on(e, draw));
    draw();
    return () => events.forEach((e) => model.off(e, draw));
  },
};
