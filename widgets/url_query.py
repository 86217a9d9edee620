"""A dashboard's URL query in a Voila page: read it, check it (``lab.url_query``), say in the page what is wrong.

A dashboard cell calls ``query = dashboard_query(name=Param(...), ...)`` and builds its widget from
``query`` when it is not ``None``; a bad link shows :func:`query_message` (which parameter, what it accepts,
what the dashboard reads) in place of the widget, and no traceback.
"""

from __future__ import annotations

import html
import os
from typing import Any

import ipywidgets as W
from IPython.display import display

from lab.url_query import Param, QueryError, describe, parse_query

__all__ = ["page_query_string", "dashboard_query", "query_message"]


def page_query_string() -> str:
    """The query string of the page this kernel serves ('' in JupyterLab or nbclient without ``QUERY_STRING``).

    Voila sets ``QUERY_STRING`` in a kernel it starts for a page; a preheated kernel (``VOILA_PREHEAT=True``)
    was started before any page asked, so this waits for the page's request (``voila.utils.get_query_string``).
    """
    if os.environ.get("VOILA_PREHEAT") == "True":
        from voila.utils import get_query_string

        os.environ["QUERY_STRING"] = get_query_string() or ""
    return os.environ.get("QUERY_STRING", "")


def query_message(error: QueryError) -> W.HTML:
    """The page's explanation of ``error``: each problem, then every parameter the dashboard reads."""
    problems = "".join(f"<li><code>{html.escape(p, quote=False)}</code></li>" for p in error.problems)
    reads = "".join(f"<li>{html.escape(line, quote=False)}</li>" for line in describe(error.params)) or "<li>no parameters</li>"
    box = W.HTML(f"<div><b>This link's query cannot be used:</b><ul>{problems}</ul>"
                 f"<b>This dashboard reads:</b><ul>{reads}</ul>Fix or remove the parameter and reload.</div>")
    box.add_class("lab-query-error")
    return box


def dashboard_query(**params: Param) -> dict[str, Any] | None:
    """The page's values of ``params`` (see :func:`lab.url_query.parse_query`), or ``None`` after showing why not.

    Returns
    -------
    dict or None
        ``{name: value}`` for every parameter; ``None`` when the query is bad, once :func:`query_message` is displayed.
    """
    try:
        return parse_query(page_query_string(), params)
    except QueryError as e:
        display(query_message(e))
        return None
