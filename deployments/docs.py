"""The README's generated tables: settings and config knobs, made from the code.

A generated table sits between ``<!-- generated:NAME -->`` and
``<!-- /generated:NAME -->``; ``replace_block`` swaps what is between them, so the prose
around it stays hand-written. The tables come from the fields themselves (their
descriptions, bounds and defaults, in ``models/settings.py`` and ``models/config.py``),
so the README cannot say one thing while the code does another: ``tests/test_docs.py``
fails when the committed README differs from what this module makes of it.

``python -m reverie.deployments.docs`` (``make docs``) rewrites the README in place;
``--check`` only says whether it would change.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from reverie.models.config import PRESETS, ConsolidationConfig
from reverie.models.settings import Settings

README = Path(__file__).resolve().parent.parent / "README.md"

# Variables a default is computed from: left out while the defaults are shown, so the
# table says what a user who sets none of them gets, whoever generates it.
_DEFAULT_INPUTS = ("XDG_DATA_HOME", "XDG_CACHE_HOME")


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with what lies between the markers of ``name`` replaced by ``body``.
    Exactly one pair of markers must be there: a missing or doubled block is an error,
    never a silent no-op."""
    start, end = f"<!-- generated:{name} -->", f"<!-- /generated:{name} -->"
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"expected one {start} ... {end} block, found "
                         f"{text.count(start)} and {text.count(end)}")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{body.rstrip(chr(10))}\n{end}{tail}"


def _cell(text: str) -> str:
    """One table cell: one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def _shown(value: Any) -> str:
    """A default as a user writes it: a quoted value, or ``unset``."""
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, tuple):
        return ", ".join(f"`{v}`" for v in value) if value else "`()`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def _bounds(field: FieldInfo) -> str:
    """What a field accepts, from its type and its bounds."""
    low = high = ""
    parts: list[str] = []
    for meta in field.metadata:
        if isinstance(meta, Ge):
            low = f">= {_number(meta.ge)}"  # type: ignore[arg-type]  # numeric bounds only
        elif isinstance(meta, Gt):
            low = f"> {_number(meta.gt)}"  # type: ignore[arg-type]  # numeric bounds only
        elif isinstance(meta, Le):
            high = f"<= {_number(meta.le)}"  # type: ignore[arg-type]  # numeric bounds only
        elif isinstance(meta, Lt):
            high = f"< {_number(meta.lt)}"  # type: ignore[arg-type]  # numeric bounds only
        elif isinstance(meta, MinLen) and meta.min_length:
            parts.append("not empty")
        elif isinstance(meta, MaxLen):
            parts.append(f"at most {meta.max_length:,} characters")
    choices = _choices(field.annotation)
    if choices:
        parts.insert(0, " or ".join(f"`{c}`" for c in choices))
    if low.startswith(">= ") and high.startswith("<= "):
        parts.insert(0, f"{low[3:]} to {high[3:]}")
    elif low or high:
        parts.insert(0, " and ".join(b for b in (low, high) if b))
    return "; ".join(parts)


def _choices(annotation: Any) -> list[str]:
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return [str(member.value) for member in annotation]
    if get_origin(annotation) is Literal:
        return [str(a) for a in get_args(annotation)]
    for arg in get_args(annotation):  # X | None
        if arg is not type(None):
            found = _choices(arg)
            if found:
                return found
    return []


@contextmanager
def _without(names: tuple[str, ...]) -> Iterator[None]:
    saved = {n: os.environ.pop(n) for n in names if n in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _default(field: FieldInfo) -> Any:
    with _without(_DEFAULT_INPUTS):
        value = field.get_default(call_default_factory=True)
    home = str(Path.home().resolve())
    if isinstance(value, str) and home in value:
        value = value.replace(home, "~")
    return value


def settings_table(settings: type[BaseModel] = Settings) -> str:
    """Every environment variable: its default, what it accepts, what it does."""
    prefix = str(settings.model_config.get("env_prefix", "")).upper()
    rows = ["| variable | default | accepts | what it does |", "|---|---|---|---|"]
    for name, field in settings.model_fields.items():
        accepts = _bounds(field)
        if name == "preset":  # a name preset() looks up, not a type's choices
            accepts = " or ".join(f"`{p}`" for p in PRESETS)
        rows.append(f"| `{prefix}{name.upper()}` | {_cell(_shown(_default(field)))} | "
                    f"{_cell(accepts)} | {_cell(field.description or '')} |")
    return "\n".join(rows)


def config_table(config: type[BaseModel] = ConsolidationConfig) -> str:
    """Every knob of a flow's ``config``, section by section, as ``config.section.knob``."""
    rows = ["| knob | default | accepts | what it does |", "|---|---|---|---|"]

    def walk(model: type[BaseModel], path: str) -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                rows.append(f"| **`{path}{name}`** | | | {_cell(field.description or '')} |")
                walk(annotation, f"{path}{name}.")
                continue
            rows.append(f"| `{path}{name}` | {_cell(_shown(_default(field)))} | "
                        f"{_cell(_bounds(field))} | {_cell(field.description or '')} |")

    walk(config, "config.")
    return "\n".join(rows)


# Each generated block of the README and what makes it.
BLOCKS: Mapping[str, Callable[[], str]] = {
    "settings": settings_table,
    "config": config_table,
}


def render(text: str, blocks: Mapping[str, Callable[[], str]] = BLOCKS) -> str:
    """``text`` with every block of ``blocks`` made afresh."""
    for name, make in blocks.items():
        text = replace_block(text, name, make())
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reverie.deployments.docs",
        description="Regenerate the README's tables of settings and config knobs.")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 when the README is out of date")
    parser.add_argument("--readme", type=Path, default=README)
    args = parser.parse_args(argv)
    text = args.readme.read_text(encoding="utf-8")
    fresh = render(text)
    if args.check:
        if fresh != text:
            print(f"{args.readme} is out of date: run `make docs`", file=sys.stderr)
            return 1
        return 0
    if fresh != text:
        args.readme.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

