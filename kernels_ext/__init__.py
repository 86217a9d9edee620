"""IPython kernel extension for the lab: ``%load_ext kernels_ext``.

Loading it

* registers rich HTML display for ``lab`` objects (:class:`~lab.hpc.swf.SWFTrace`,
  :class:`~lab.hpc.queue.QueueReplay`), so a trace shows its header and first jobs;
* adds the ``%lab_data`` line magic, which lists the data registry and where each
  data set resolves (``%lab_data theta_2022`` prints one path, fetching if needed).

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
