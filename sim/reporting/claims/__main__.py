"""`python -m sim.reporting.claims --out docs/claims.md [--short]`: run every claim, write the markdown."""
from __future__ import annotations

import argparse
from pathlib import Path

from sim.files import write_file
from sim.reporting.claims import __doc__ as AUDIT_DOC
from sim.reporting.claims import render, run_all


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m sim.reporting.claims", description=AUDIT_DOC.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("docs/claims.md"), help="markdown file to write")
    p.add_argument("--short", action="store_true", help="fewer requests and sweep points")
    args = p.parse_args(argv)
    write_file(args.out, render(run_all(args.short), args.short))
    print(args.out)


if __name__ == "__main__":
    main()
