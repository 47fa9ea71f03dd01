"""Every generated part of the documents, made by one command.

``python -m reverie.deployments.docs`` (``make docs``) makes them all afresh: the README's
tables of settings, config knobs and commands, and the whole of BENCHMARKS.md. With
``--check`` it changes nothing and exits 1 naming each document that would change; the
drift tests (``tests/test_docs.py``, ``tests/test_benchmarks_report.py``) call the same
``check``.

A generated table of the README sits between ``<!-- generated:NAME -->`` and
``<!-- /generated:NAME -->``; ``replace_block`` swaps what is between them, so the prose
around it stays hand-written. The tables come from the fields themselves (their
descriptions, bounds and defaults, in ``models/settings.py`` and ``models/config.py``)
and from the ``reverie`` command (``command_docs``), so the README cannot say one thing
while the code does another. BENCHMARKS.md is what ``benchmarks/report.py`` makes of the
benches' JSON in ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from reverie.benchmarks.report import page
from reverie.deployments.command_docs import commands_table
from reverie.models.config import PRESETS, ConsolidationConfig
from reverie.models.settings import Settings

ROOT = Path(__file__).resolve().parent.parent

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
    "commands": commands_table,
}


def render(text: str, blocks: Mapping[str, Callable[[], str]] = BLOCKS) -> str:
    """``text`` with every block of ``blocks`` made afresh."""
    for name, make in blocks.items():
        text = replace_block(text, name, make())
    return text


@dataclass(frozen=True)
class Document:
    """One generated document: where it lives, and what it should say given what it says
    now (the README keeps its prose and gets its blocks made afresh; BENCHMARKS.md is
    made whole)."""

    path: Path
    make: Callable[[str], str]


def readme(root: Path = ROOT) -> Document:
    return Document(root / "README.md", render)


def benchmarks(root: Path = ROOT) -> Document:
    results = root / "benchmarks" / "results"
    return Document(root / "BENCHMARKS.md", lambda _: page(results))


def documents(root: Path = ROOT) -> tuple[Document, ...]:
    return readme(root), benchmarks(root)


def stale(docs: Sequence[Document]) -> list[tuple[Document, str]]:
    """Each document that differs from what it should say, with what it should say."""
    out = []
    for doc in docs:
        current = doc.path.read_text(encoding="utf-8") if doc.path.exists() else ""
        fresh = doc.make(current)
        if fresh != current:
            out.append((doc, fresh))
    return out


def check(docs: Sequence[Document]) -> list[str]:
    """What drifted, one line per document, empty when nothing did: what ``--check``
    prints and what the drift tests assert."""
    return [f"{doc.path.name} is out of date: run `make docs` "
            "(python -m reverie.deployments.docs)" for doc, _ in stale(docs)]


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reverie.deployments.docs",
        description="Regenerate every generated part of the documents: the README's tables "
                    "of settings, config knobs and commands, and BENCHMARKS.md.")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming each document that is out of date")
    args = parser.parse_args(argv)
    docs = documents(root)
    if args.check:
        drifted = check(docs)
        for line in drifted:
            print(line, file=sys.stderr)
        return 1 if drifted else 0
    for doc, fresh in stale(docs):
        doc.path.write_text(fresh, encoding="utf-8")
        print(f"wrote {doc.path.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
