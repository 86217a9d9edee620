"""Line magics of the lab's kernel extension."""

from __future__ import annotations

from IPython.core.magic import Magics, line_magic, magics_class

from lab import data


@magics_class
class LabMagics(Magics):
    @line_magic
    def lab_data(self, line: str):
        """``%lab_data`` lists the registered data sets and where each resolves;
        ``%lab_data NAME`` returns the verified local path of one (fetching it if needed)."""
        name = line.strip()
        if name:
            return data.fetch(name)
        rows = []
        for n in data.names():
            try:
                where = data.locate(n) or (f"not installed ({data.info(n).install})" if data.info(n).kind == "package" else "not local (fetched from its URL on first use)")
            except data.ChecksumError as exc:
                where = f"CORRUPTED: {exc}"
            rows.append(f"{n:32s} {where}")
        print("\n".join(rows))
