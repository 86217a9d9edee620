// LiveChart: draws the plotly figure held in the model's `figure` trait ({data, layout}) and redraws it
// whenever the trait changes (Plotly.react). The figure is state, not a stream of edits: a view that
// renders late, or again, draws everything the kernel has set so far.
//
// This module stays small on purpose: anywidget gives a model's ESM two seconds to load and initialise,
// and when that fails every later comm message to the model is dropped without a word. plotly.js
// (4.8 MB) therefore travels in a separate PlotlyLibrary model (`_library`), is imported from there once
// per page when the first view renders, and is cached on `window`.

const CACHE = "__labPlotly";

async function loadPlotly(model) {
  const ref = model.get("_library") || "";
  const lib = await model.widget_manager.get_model(ref.replace(/^IPY_MODEL_/, ""));
  const version = lib.get("version");
  const cache = (window[CACHE] = window[CACHE] || {});
  if (!cache[version]) {
    const url = URL.createObjectURL(new Blob([lib.get("source")], { type: "text/javascript" }));
    cache[version] = import(/* webpackIgnore: true */ url)
      .then((m) => m.default)
      .finally(() => URL.revokeObjectURL(url));
  }
  return cache[version];
}

export default {
  async render({ model, el }) {
    el.classList.add("lab-live-chart");
    const plot = document.createElement("div");
    plot.className = "lab-live-chart-plot";
    el.appendChild(plot);
    const Plotly = await loadPlotly(model);
    let drawing = Promise.resolve();
    const draw = () => {
      const fig = model.get("figure") || {};
      drawing = drawing.then(() =>
        Plotly.react(plot, fig.data || [], fig.layout || {}, { displaylogo: false, responsive: true, ...(model.get("config") || {}) }),
      );
      return drawing;
    };
    model.on("change:figure", draw);
    await draw();
    const resize = new ResizeObserver(() => { if (plot.isConnected && plot.clientWidth > 0) Plotly.Plots.resize(plot); });
    resize.observe(el);
    return () => {
      model.off("change:figure", draw);
      resize.disconnect();
      Plotly.purge(plot);
    };
  },
};
