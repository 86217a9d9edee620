"""A plotly chart that a kernel thread can redraw live: the figure is one synced trait, drawn whole.

Why not ``plotly.graph_objects.FigureWidget``: it is an anywidget whose ESM is plotly.js itself (about
5 MB), and anywidget (0.11) gives a model's ESM two seconds to load and initialise; past that, every
later comm message to the model is dropped (``AnyModel._handle_comm_msg`` awaits the rejected
``runtime.ready``, and JupyterLab's kernel connection swallows the error). On a machine busy with
training processes the figure then stays as its comm opened: plotly's empty default axes, for good.
FigureWidget also sends edits (``_py2js_addTraces``, ``_py2js_update``) rather than state, so a view
that missed one never catches up.

:class:`LiveChart` has a small ESM (``live_chart.js``) and a ``figure`` trait holding the whole
figure (``{"data": [...], "layout": {...}}``, plain JSON made by the caller); every view draws it
with ``Plotly.react`` when it renders and whenever it changes. plotly.js comes from the one
:class:`PlotlyLibrary` model of the kernel (sent once, imported once per page), with no request off
the machine.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as W
import plotly
import traitlets as t

__all__ = ["ESM", "LiveChart", "PlotlyLibrary", "plotly_library"]

#: The chart's front end (a small ES module).
ESM = Path(__file__).with_name("live_chart.js")

_PLOTLY_JS = Path(plotly.__file__).with_name("package_data") / "plotly.min.js"


class PlotlyLibrary(W.Widget):
    """plotly.js as an ES module, in one plain widget model (``@jupyter-widgets/base`` WidgetModel, no
    view): ``source`` is ``plotly.min.js`` (the UMD build that ships with the plotly package) wrapped so
    that ``import()`` gives ``Plotly`` as its default export; ``version`` keys the page's cache."""

    _model_name = t.Unicode("WidgetModel").tag(sync=True)
    _model_module = t.Unicode("@jupyter-widgets/base").tag(sync=True)
    _model_module_version = t.Unicode(W.__jupyter_widgets_base_version__).tag(sync=True)
    version = t.Unicode().tag(sync=True)
    source = t.Unicode().tag(sync=True)

    def __init__(self, **kwargs: Any):
        text = _PLOTLY_JS.read_text(encoding="utf-8")
        # the UMD header assigns module.exports when `module` is an object: give it one
        wrapped = f"const module = {{ exports: {{}} }};\n{text}\nexport default module.exports;\n"
        super().__init__(version=f"plotly.js for plotly.py {plotly.__version__}", source=wrapped, **kwargs)


_LIBRARY: PlotlyLibrary | None = None
_LIBRARY_LOCK = threading.Lock()


def plotly_library() -> PlotlyLibrary:
    """The kernel's one :class:`PlotlyLibrary` (made again if it was closed)."""
    global _LIBRARY
    with _LIBRARY_LOCK:
        if _LIBRARY is None or _LIBRARY.comm is None:
            _LIBRARY = PlotlyLibrary()
        return _LIBRARY


class LiveChart(anywidget.AnyWidget):
    """Draws ``figure`` (a plotly figure as JSON: ``{"data": [...], "layout": {...}}``) and redraws it
    whenever it is set, from any thread; ``config`` is plotly's config (``displaylogo`` off, responsive)."""

    _esm = ESM
    _library = t.Instance(PlotlyLibrary).tag(sync=True, **W.widget_serialization)
    figure = t.Dict().tag(sync=True)
    config = t.Dict().tag(sync=True)

    def __init__(self, figure: dict | None = None, **kwargs: Any):
        super().__init__(_library=plotly_library(), figure=figure or {"data": [], "layout": {}}, **kwargs)
