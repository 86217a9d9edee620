"""A shared dashboard's parameters, read from its page's URL query (``?trace=hpc2n&day=30``).

A dashboard (``notebooks/dashboards/``) declares the parameters it reads, each a :class:`Param` (its default,
its type, the values it accepts), and :func:`parse_query` turns the page's query string into those values or
raises :class:`QueryError` naming every offending parameter with what it accepts, so a link that is mistyped
or out of date says what is wrong instead of failing somewhere inside the dashboard. Keys Voila itself reads
from the URL (:data:`SERVER_KEYS`: the token, the template and theme choices) are left to it. This module is
pure Python; ``widgets.url_query`` reads the query of the Voila page and shows the error in it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

__all__ = ["SERVER_KEYS", "Param", "QueryError", "parse_query", "describe"]

#: query keys the Jupyter server and Voila read themselves (auth token, template, theme): never a dashboard's
SERVER_KEYS = frozenset({"token", "voila-template", "voila-theme"})

_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string"}


class QueryError(ValueError):
    """A URL query a dashboard cannot use.

    Attributes
    ----------
    problems : list of str
        One line per offending parameter: ``?key=value`` and why (an unknown key names the keys the dashboard
        reads; a bad value names the values the parameter accepts).
    params : dict of str to Param
        What the dashboard reads (for a message listing every parameter).
    """

    def __init__(self, problems: Sequence[str], params: Mapping[str, Param]):
        self.problems = list(problems)
        self.params = dict(params)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class Param:
    """One parameter a dashboard reads from its URL query.

    Parameters
    ----------
    default : Any
        The value when the query does not give it (a tuple when ``many``).
    type : callable
        ``int``, ``float`` or ``str``: how the query's text is read (``int("2.5")`` is refused).
    choices : sequence, optional
        The accepted values (after ``type``); any other is refused, naming these.
    minimum, maximum : float, optional
        Inclusive bounds on a number.
    many : bool
        A comma-separated list (``?runs=fp32,fp8``), each item checked, repeats dropped; the value is a tuple.
    help : str
        What the parameter sets, for the page's message and the README.
    """

    default: Any
    type: Callable[[str], Any] = str
    choices: Sequence[Any] | None = None
    minimum: float | None = None
    maximum: float | None = None
    many: bool = False
    help: str = ""

    def accepted(self) -> str:
        """What this parameter accepts, in words (``"one of fp32, fp8"``, ``"an integer from 1 to 16"``)."""
        if self.choices is not None:
            values = ", ".join(str(c) for c in self.choices)
            return f"comma-separated, some of {values}" if self.many else f"one of {values}"
        kind = _TYPE_NAMES.get(self.type, getattr(self.type, "__name__", str(self.type)))
        if self.minimum is not None and self.maximum is not None:
            kind += f" from {self.minimum:g} to {self.maximum:g}"
        elif self.minimum is not None:
            kind += f" >= {self.minimum:g}"
        elif self.maximum is not None:
            kind += f" <= {self.maximum:g}"
        return f"comma-separated, each {kind}" if self.many else kind

    def read(self, text: str) -> Any:
        """The value of ``text`` (one query value, already URL-decoded).

        Raises
        ------
        ValueError
            ``text`` is not of this parameter's type, outside its bounds or not one of its choices; the message
            says what is accepted.
        """
        items = [t.strip() for t in text.split(",")] if self.many else [text.strip()]
        if self.many and not any(items):
            raise ValueError(f"empty; accepted: {self.accepted()}")
        values = []
        for item in items:
            try:
                value = self.type(item)
            except (TypeError, ValueError):
                raise ValueError(f"{item!r} is not {self.accepted()}") from None
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{item!r} is not {self.accepted()}")
            if self.choices is not None and value not in self.choices:
                raise ValueError(f"{item!r} is not {self.accepted()}")
            if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
                raise ValueError(f"{item!r} is not {self.accepted()}")
            if value not in values:
                values.append(value)
        return tuple(values) if self.many else values[0]


def parse_query(query_string: str, params: Mapping[str, Param]) -> dict[str, Any]:
    """The values of ``params`` that ``query_string`` gives, defaults for the rest.

    Parameters
    ----------
    query_string : str
        The URL's query, with or without its leading ``?`` (``"trace=hpc2n&day=30"``); percent-decoded here.
        Keys in :data:`SERVER_KEYS` are skipped.
    params : mapping of str to Param
        The parameters the dashboard reads.

    Returns
    -------
    dict of str to Any
        One entry per parameter, in ``params``' order.

    Raises
    ------
    QueryError
        Listing every problem at once: an unknown key (naming the keys read), a key given twice, a bad value
        (naming what that parameter accepts).
    """
    values = {name: p.default for name, p in params.items()}
    problems: list[str] = []
    seen: set[str] = set()
    for key, text in parse_qsl(query_string.lstrip("?"), keep_blank_values=True):
        if key in SERVER_KEYS:
            continue
        if key not in params:
            known = ", ".join(params) or "none"
            problems.append(f"?{key}={text}: this dashboard reads no parameter {key!r} (it reads: {known})")
            continue
        if key in seen:
            problems.append(f"?{key}: given more than once")
            continue
        seen.add(key)
        try:
            values[key] = params[key].read(text)
        except ValueError as e:
            problems.append(f"?{key}={text}: {e}")
    if problems:
        raise QueryError(problems, params)
    return values


def describe(params: Mapping[str, Param]) -> list[str]:
    """One line per parameter: ``name``: what it sets, what it accepts, its default (for messages and docs)."""
    lines = []
    for name, p in params.items():
        default = ",".join(map(str, p.default)) if p.many else p.default
        what = f"{p.help}: " if p.help else ""
        lines.append(f"{name}: {what}{p.accepted()} (default {default})")
    return lines
