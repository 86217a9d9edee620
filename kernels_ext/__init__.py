"""IPython kernel extension for the lab: ``%load_ext kernels_ext``.

Loading it

* registers rich HTML display (a notebook) and a one-line plain summary (a terminal) for the
  ``lab`` objects a user meets: traces, replays, testbed sites, provenance graphs, run monitors,
  restoration results;
* adds the line magics ``%lab_data``, ``%lab_sites``, ``%lab_queue SITE|TRACE``, ``%lab_trace PATH``,
  ``%lab_runs [DIR]`` and ``%lab_restore IMAGE --method M --task T`` (each with ``--help``;
  see :mod:`kernels_ext.magics`).

The formatters live in :mod:`kernels_ext.display`; they only format what the
``lab`` objects already hold.
"""

from __future__ import annotations

from kernels_ext.display import register_formatters, unregister_formatters
from kernels_ext.magics import LabMagics

__all__ = ["load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython) -> None:
    """Called by ``%load_ext kernels_ext``."""
    register_formatters(ipython)
    ipython.register_magics(LabMagics)


def unload_ipython_extension(ipython) -> None:
    """Called by ``%unload_ext kernels_ext``: removes the formatters (magics stay, as IPython allows)."""
    unregister_formatters(ipython)
