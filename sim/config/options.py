"""A command's options as plain data. Each field of a command's request (RunRequest, PlanRequest,
...) carries how the command line spells it, in its `metadata`, so that `cli.py` builds each
command's options from the request it fills instead of declaring them a second time:

    out: Path | None = field(default=None, metadata=option("Output directory.", "--out", "-o", metavar="DIR"))

The request's field name, type and default are the option's; the help is rich markup (typer's
`rich_markup_mode`). Nothing here imports typer: a notebook builds the same requests by hand."""
from __future__ import annotations

from dataclasses import Field, dataclass, fields
from typing import Any

KEY = "option"  # the metadata key that holds a field's Option


@dataclass(frozen=True)
class Option:
    """How one request field is spelled on the command line."""
    help: str
    names: tuple[str, ...] = ()       # e.g. ("--out", "-o"), ("--band/--no-band",); (): --field-name
    metavar: str | None = None
    show_default: bool = True         # False where the help says the default itself ("\\[default: ...]")
    argument: bool = False            # positional, not an option
    min: int | None = None            # bounds click checks (typer's min= / max=)
    max: int | None = None


def option(help: str, *names: str, metavar: str | None = None, show_default: bool = True,
           min: int | None = None, max: int | None = None) -> dict[str, Option]:
    """A field's metadata: an option spelled `names` (none: --field-name)."""
    return {KEY: Option(help, tuple(names), metavar, show_default, False, min, max)}


def argument(help: str) -> dict[str, Option]:
    """A field's metadata: a positional argument."""
    return {KEY: Option(help, (), None, False, True)}


def declared(request: Any) -> list[tuple[Field, Option]]:
    """(field, Option) for each field of a request dataclass the command line sets, in order."""
    return [(f, f.metadata[KEY]) for f in fields(request) if KEY in f.metadata]
