"""research-lab core: the GPU-backed package under the notebooks and widgets.

``lab`` never imports Jupyter. Each facet is a subpackage (``lab.hpc``,
``lab.data``, ...) with its own exception hierarchy deriving from
:class:`LabError`, so one ``except lab.LabError`` catches everything the lab
raises on purpose.
"""

from __future__ import annotations

__all__ = ["LabError", "__version__"]

__version__ = "0.1.0"


class LabError(Exception):
    """Root of every error ``lab`` raises deliberately (bad input, missing data, ...)."""
