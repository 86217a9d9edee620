"""``python -m lab.data``: list, verify or fetch the registered data sets.

    python -m lab.data                   # where each data set resolves (never downloads)
    python -m lab.data fetch --all       # verify every data set, downloading what is not local
    python -m lab.data fetch theta_2022  # one or more by name

Exit status 0 when every data set asked for resolved and verified, 1 otherwise (each problem printed).
"""

from __future__ import annotations

import argparse
import sys

from lab import data
from lab.data.report import check, format_rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.data", description="the lab's data registry")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("list", help="where each data set resolves, verified (never downloads; the default)")
    fetch = sub.add_parser("fetch", help="verify data sets, downloading what no local place holds")
    fetch.add_argument("names", nargs="*", help="registry names (see `list`)")
    fetch.add_argument("--all", action="store_true", help="every registered data set")
    fetch.add_argument("--no-download", action="store_true", help="verify local copies only")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        if bool(args.names) == args.all:
            parser.error("name the data sets to fetch, or pass --all (not both)")
        names, download = (None if args.all else args.names), not args.no_download
    else:
        names, download = None, False
    try:
        rows = check(names, download=download, progress=sys.stderr.isatty() or args.command == "fetch")
    except data.UnknownDatasetError as exc:
        parser.error(str(exc))
    print(format_rows(rows))
    bad = [r for r in rows if not r.ok]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} data sets verified"
          + (f"; {len(bad)} not: {', '.join(r.name for r in bad)}" if bad else ""), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
