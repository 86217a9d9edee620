"""A gallery of example images to click (Gradio's ``Examples`` under an image input): a thin anywidget.

:class:`ImageGallery` draws ``items`` (label and PNG bytes each, sent as ``data:`` URLs so that the
page requests nothing) as a row of thumbnails; a click sets ``selected`` to the item's index, and
setting ``selected`` from Python (-1 for none) highlights it. What the items are is the caller's
business (the restoration demo passes :func:`lab.generative.demo.gallery`).
"""

from __future__ import annotations

import base64
from pathlib import Path

import anywidget
import traitlets as t

__all__ = ["ImageGallery"]


class ImageGallery(anywidget.AnyWidget):
    """Clickable thumbnails.

    Parameters
    ----------
    items : list of dict
        ``{"label": str, "png": bytes}`` each (other keys are ignored).
    thumb_px : int
        Width and height of each thumbnail on screen (pixels; nearest-neighbour scaled by the browser).

    Attributes
    ----------
    selected : int
        Index of the item last clicked or set; -1 for none.
    """

    _esm = Path(__file__).with_name("image_gallery.js")
    items = t.List(t.Dict()).tag(sync=True)
    selected = t.Int(-1).tag(sync=True)
    thumb_px = t.Int(48).tag(sync=True)

    def __init__(self, items: list[dict] | None = None, thumb_px: int = 48, **kwargs):
        super().__init__(thumb_px=int(thumb_px), **kwargs)
        self.set_items(items or [])

    def set_items(self, items: list[dict]) -> None:
        """Replace the thumbnails (``selected`` becomes -1)."""
        self.selected = -1
        self.items = [{"label": str(it["label"]), "src": "data:image/png;base64," + base64.b64encode(bytes(it["png"])).decode()}
                      for it in items]
