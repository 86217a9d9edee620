// ImageGallery: a row of example thumbnails (Gradio's Examples); clicking one sets `selected` to its index.
// `items` is [{label, src}] with `src` a data: URL, so the page requests nothing; `selected` (-1: none)
// is drawn as a highlighted border, whichever side set it.

export default {
  render({ model, el }) {
    el.classList.add("lab-gallery");
    const row = document.createElement("div");
    row.className = "lab-gallery-row";
    row.style.cssText = "display:flex;flex-wrap:wrap;gap:6px;align-items:flex-start";
    el.appendChild(row);
    const draw = () => {
      row.replaceChildren();
      const size = model.get("thumb_px");
      (model.get("items") || []).forEach((item, i) => {
        const button = document.createElement("button");
        button.type = "button";
        button.className = "lab-gallery-item";
        button.title = item.label;
        button.dataset.index = String(i);
        button.setAttribute("aria-label", `use example: ${item.label}`);
        button.style.cssText = "padding:2px;background:#fff;cursor:pointer;border-radius:3px;line-height:0;border:2px solid #ccc";
        const img = document.createElement("img");
        img.src = item.src;
        img.alt = item.label;
        img.width = size;
        img.height = size;
        img.style.imageRendering = "pixelated";
        button.appendChild(img);
        button.addEventListener("click", () => {
          model.set("selected", i);
          model.save_changes();
        });
        row.appendChild(button);
      });
      mark();
    };
    const mark = () => {
      const selected = model.get("selected");
      row.querySelectorAll(".lab-gallery-item").forEach((b) => {
        const on = Number(b.dataset.index) === selected;
        b.classList.toggle("lab-gallery-selected", on);
        b.style.borderColor = on ? "#1976d2" : "#ccc";
      });
    };
    model.on("change:items", draw);
    model.on("change:thumb_px", draw);
    model.on("change:selected", mark);
    draw();
    return () => {
      model.off("change:items", draw);
      model.off("change:thumb_px", draw);
      model.off("change:selected", mark);
    };
  },
};
