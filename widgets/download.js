// DownloadButton: a button that saves the model's `text` as a file in the browser (a Blob and an <a download>).
// The text is synced state, so a click needs no round trip to the kernel: it works while the kernel is busy
// (a notebook cell waiting on training runs), and a data set larger than a data: URL's 2 MB limit still saves.

export default {
  render({ model, el }) {
    const button = document.createElement("button");
    button.className = "jupyter-button widget-button lab-download-button";
    button.style.width = "auto"; // the label says how much it saves: do not cut it to ipywidgets' fixed width
    const update = () => {
      button.textContent = model.get("label");
      button.title = model.get("hint");
      button.disabled = !model.get("text");
      button.dataset.filename = model.get("filename");
    };
    const save = () => {
      const url = URL.createObjectURL(new Blob([model.get("text")], { type: model.get("mime") }));
      const a = document.createElement("a");
      a.href = url;
      a.download = model.get("filename");
      a.style.display = "none";
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60_000);
    };
    const events = ["change:label", "change:hint", "change:text", "change:filename"];
    events.forEach((e) => model.on(e, update));
    button.addEventListener("click", save);
    update();
    el.appendChild(button);
    return () => events.forEach((e) => model.off(e, update));
  },
};
