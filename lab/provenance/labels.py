"""Readable labels for the nodes of an execution graph (what an explorer writes under each node).

A graph explorer cannot print a node's whole text: a tool call's text is its name followed by its
arguments as raw JSON, a tool result is the tool's JSON answer, a claim is a paragraph. Cutting those at
a fixed width (``book_reservation({"cabin":"economy","de…``) says little. :func:`node_label` writes,
instead, two short lines that name the step the way trace viewers do (Langfuse's and Arize Phoenix's
span trees name a span by its tool or model and show the input on demand):

=================== ============================================ ==========================================
node                first line                                   second line
=================== ============================================ ==========================================
tool call (action)  the tool's name                              its key arguments (:func:`key_arguments`)
tool result         ``<tool> result`` (``<tool> error`` when the the key arguments of the call, or the
(source)            result starts with ``Error``; a long name    error message
                    alone: the shape says it is a result)
other source,       the text's first words, cut at a word        the next words, ``…`` if there is more
claim, memory       boundary (``user: …`` for a user message)
agent               its role and name (``user mia_li_3668``)
=================== ============================================ ==========================================

The full text and every argument stay in the node's data (``text``, ``arguments``): the explorer's detail
panel shows them whole. A node is a *tool call* or *tool result* when it carries ``attributes["tool"]``
(both ingests, :mod:`lab.provenance.ingest`, set it) or, failing that, when its text reads
``name({...json object...})``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from lab.provenance.graph import Node, NodeType

__all__ = ["LINE_CHARS", "tool_call", "key_arguments", "node_label"]

#: Each line of a label holds at most this many characters.
LINE_CHARS = 30

_CALL = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\((.*)\)\s*$", re.S)


def _arguments(value: Any) -> dict[str, Any] | None:
    """``value`` as an argument object: a dict, or a string holding a JSON object; else ``None``."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return None
        return parsed if isinstance(parsed, dict) else None
    return None


def tool_call(node: Node) -> tuple[str, dict[str, Any]] | None:
    """``(tool name, arguments)`` of a tool call or tool result node, else ``None``.

    From ``attributes["tool"]`` with ``attributes["arguments"]`` (tau-bench) or ``attributes["input"]``
    (an OpenInference tool span's ``input.value``, when it is a JSON object; ``{}`` otherwise); for a node
    without them, from a text of the form ``name({...})``.
    """
    tool = node.attributes.get("tool")
    if isinstance(tool, str) and tool:
        args = _arguments(node.attributes.get("arguments"))
        if args is None:
            args = _arguments(node.attributes.get("input"))
        return tool, args or {}
    if node.type in (NodeType.ACTION, NodeType.SOURCE):
        m = _CALL.match(node.text)
        if m:
            args = _arguments(m.group(2)) if m.group(2).strip() else {}
            if args is not None:
                return m.group(1), args
    return None


def _is_key(name: str) -> bool:
    n = name.lower()
    return n == "id" or n.endswith(("_id", "_number", "id")) or n in {"origin", "destination", "date", "query", "expression"}


def _scalar(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None if value is None else str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return " ".join(value.split())
    return None


def key_arguments(arguments: Mapping[str, Any], limit: int = LINE_CHARS) -> str:
    """The arguments that identify a call, as ``name=value, ...`` in at most ``limit`` characters.

    Scalar arguments only (numbers, strings, booleans; lists and objects are left to the detail panel),
    identifier-like ones first (``*_id``, ``*_number``, ``origin``, ``destination``, ``date``, ``query``),
    then the others in their order; as many whole ``name=value`` pairs as fit, then ``+N`` for the number
    of arguments left out. A single pair too long for the line keeps its name and the start of its value
    with ``…``. ``""`` without arguments.
    """
    items = [(k, s) for k, v in arguments.items() if (s := _scalar(v)) is not None and s != ""]
    items.sort(key=lambda kv: not _is_key(kv[0]))  # stable: identifiers first, each group in its order
    total = len(arguments)
    parts: list[str] = []
    for k, v in items:
        pair = f"{k}={v}"
        rest = total - len(parts) - 1
        more = f" +{rest}" if rest else ""
        line = ", ".join([*parts, pair]) + more
        if len(line) <= limit:
            parts.append(pair)
            continue
        if not parts:  # the first pair alone is too long: cut its value
            room = limit - len(k) - 2 - len(more)
            if room >= 4:
                parts.append(f"{k}={v[: room - 1]}…")
        break
    rest = total - len(parts)
    if not parts:
        return f"{total} argument{'s' if total != 1 else ''}" if total else ""
    return ", ".join(parts) + (f" +{rest}" if rest else "")


def _words(text: str, limit: int) -> tuple[str, str]:
    """The first words of ``text`` that fit in ``limit`` characters, and the rest (whitespace collapsed)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text, ""
    cut = text.rfind(" ", 0, limit + 1)
    if cut <= limit // 2:  # one long word: cut inside it
        cut = limit - 1
        return text[:cut] + "…", text[cut:]
    return text[:cut], text[cut + 1 :]


def _prose(text: str) -> str:
    first, rest = _words(text, LINE_CHARS)
    if not rest:
        return first
    second, more = _words(rest, LINE_CHARS - 1)
    if more and not second.endswith("…"):
        second += "…"
    return f"{first}\n{second}"


def node_label(node: Node) -> str:
    """Two short lines naming ``node`` (see the module docstring); each line at most :data:`LINE_CHARS` characters.

    Parameters
    ----------
    node : Node

    Returns
    -------
    str
        One or two lines joined by ``"\\n"``; the node's id when it has no text.
    """
    if node.type == NodeType.AGENT:
        role = node.attributes.get("role")
        name = " ".join(node.text.split()) or node.id
        label = name if not role or role == name else f"{role} {name}"
        return _prose(label)
    call = tool_call(node)
    if call is not None:
        name, args = call
        name = _words(name, LINE_CHARS)[0]
        if node.type == NodeType.SOURCE:
            text = node.text.strip()
            if text.lower().startswith("error"):
                message, more = _words(text, LINE_CHARS - 1)
                return f"{_words(name + ' error', LINE_CHARS)[0]}\n{message}{'…' if more and not message.endswith('…') else ''}"
            head = f"{name} result" if len(name) + 7 <= LINE_CHARS else name  # a long name alone (the shape says source)
        else:
            head = name
        args_line = key_arguments(args)
        return f"{head}\n{args_line}" if args_line else head
    text = " ".join(node.text.split())
    if text and node.type == NodeType.SOURCE and node.attributes.get("role") == "user":
        return _prose(f"user: {text}")  # a user message
    return _prose(text) if text else node.id
