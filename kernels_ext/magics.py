"""Line magics of the lab's kernel extension."""

from __future__ import annotations

from IPython.core.magic import Magics, line_magic, magics_class

from lab import data
from lab.data.report import check, format_rows


@magics_class
class LabMagics(Magics):
    @line_magic
    def lab_data(self, line: str):
        """``%lab_data`` lists the registered data sets, verified, and where each resolves
        (``LAB_DATA_DIR``, ``bundled`` with the project, ``cache``, ``package``), as
        ``python -m lab.data`` prints it; ``%lab_data NAME`` returns the verified local path of
        one (fetching it if needed)."""
        name = line.strip()
        if name:
            return data.fetch(name)
        print(format_rows(check()))
