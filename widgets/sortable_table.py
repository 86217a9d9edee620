"""A table a user sorts by clicking a header and filters by group (e.g. job state) and text.

:class:`SortableTable` draws a :class:`lab.hpc.views.Table`: every cell comes with its display text and
its sort key (computed in ``lab``), so the browser sorts durations, ids and dates by value with unknowns
last, by the rule of :meth:`lab.hpc.views.Table.view`. The sort (``sort``: ``{"key": column, "descending":
bool}``) and the filters (``group_filter``, ``text_filter``) are synced traits: they are kept when the
kernel sends a new table, and :meth:`SortableTable.shown` gives the rows in the order the page shows them.

A small ES module of its own (``sortable_table.js``), for the reason ``widgets.live_chart`` gives: a big
ESM can miss anywidget's start-up window. (itables' ITable widget sorts and searches too, but ships
DataTables and jQuery, 620 KB, in its one ESM, and sorts formatted text unless given JavaScript renderers.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import traitlets as t

from lab.hpc.views import Row, Table

__all__ = ["CSS", "SortableTable"]

CSS = """
.lab-sortable-table { width: 100%; box-sizing: border-box; min-width: 0; }
.lab-sortable-table .lab-table-caption { font-weight: bold; margin: 4px 0; }
.lab-sortable-table .lab-table-tools { display: flex; gap: 8px; align-items: center; margin: 2px 0 4px; flex-wrap: wrap; }
.lab-sortable-table .lab-table-count { color: #555; }
.lab-sortable-table .lab-table-scroll { overflow: auto; }
.lab-sortable-table table.lab-table { border-collapse: collapse; font-size: 12px; }
.lab-sortable-table th, .lab-sortable-table td { padding: 1px 8px; text-align: left; vertical-align: top; }
/* numbers, clock times and headers never wrap; long text (ids, reasons) may, so that the table fits its area */
.lab-sortable-table th, .lab-sortable-table td.lab-num { white-space: nowrap; }
.lab-sortable-table td { overflow-wrap: anywhere; }
.lab-sortable-table th { position: sticky; top: 0; background: #f2f2f2; cursor: pointer; user-select: none; }
.lab-sortable-table th:hover { background: #e4e4e4; }
.lab-sortable-table .lab-num { text-align: right; font-variant-numeric: tabular-nums; }
.lab-sortable-table tbody tr:nth-child(even) { background: #fafafa; }
.lab-sortable-table tr.lab-muted td { color: #8a8a8a; font-style: italic; }
.lab-sortable-table .lab-empty { color: #555; padding: 6px 0; }
"""


class SortableTable(anywidget.AnyWidget):
    """Draws ``table`` (:meth:`lab.hpc.views.Table.to_json`); sortable by header click, filterable.

    Parameters
    ----------
    table : lab.hpc.views.Table, optional
        What to show first (:meth:`show` shows another).
    sort : str, optional
        Key of the column sorted by at first; ``descending`` its direction.
    max_height : int
        Pixels before the rows scroll (the header stays in view).
    """

    _esm = Path(__file__).with_name("sortable_table.js")
    _css = CSS
    table = t.Dict().tag(sync=True)
    sort = t.Dict().tag(sync=True)
    group_filter = t.Unicode("").tag(sync=True)
    text_filter = t.Unicode("").tag(sync=True)
    max_height = t.Int(320).tag(sync=True)

    def __init__(self, table: Table | None = None, *, sort: str | None = None, descending: bool = False, max_height: int = 320,
                 **kwargs: Any):
        super().__init__(sort={"key": sort, "descending": descending} if sort else {}, max_height=max_height, **kwargs)
        self._table = table or Table(columns=(), rows=())
        self.table = self._table.to_json()
        self.layout.width = "100%"
        self.layout.max_width = "100%"

    @property
    def data(self) -> Table:
        """The table shown now."""
        return self._table

    def show(self, table: Table) -> None:
        """Draw ``table`` (sort and filters stay as the user left them); nothing is sent if it did not change."""
        self._table = table
        data = table.to_json()
        if data != self.table:
            self.table = data

    def shown(self) -> list[Row]:
        """The rows in the order the page shows them (this widget's sort and filters)."""
        return self._table.view(self.sort.get("key") or None, bool(self.sort.get("descending")), self.group_filter, self.text_filter)
