"""A button that saves text (a CSV, say) as a file in the browser, with no round trip to the kernel."""

from __future__ import annotations

from pathlib import Path

import anywidget
import traitlets as t

__all__ = ["DownloadButton"]


class DownloadButton(anywidget.AnyWidget):
    """Saves ``text`` as ``filename`` (MIME type ``mime``) when clicked: the front end (``download.js``)
    makes a Blob of the synced text and clicks an ``<a download>`` for it. Because the text is state, the
    click works while the kernel is busy; set ``text`` whenever what it saves changes. The button is
    disabled while ``text`` is empty.

    Attributes
    ----------
    text : str
        The file's contents (UTF-8 in the browser).
    filename : str
        The name the browser saves it under.
    mime : str
    label : str
        The button's text.
    hint : str
        Its hover text (not ipywidgets' ``tooltip``, whose view code expects a ``description`` trait).
    """

    _esm = Path(__file__).with_name("download.js")
    text = t.Unicode("").tag(sync=True)
    filename = t.Unicode("data.csv").tag(sync=True)
    mime = t.Unicode("text/csv").tag(sync=True)
    label = t.Unicode("download").tag(sync=True)
    hint = t.Unicode("").tag(sync=True)
