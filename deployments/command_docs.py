"""The README's table of commands, made from the ``reverie`` command itself: one row per
command, its synopsis from its parameters and its help as what it does.

``commands_table`` is the README's ``commands`` block: ``python -m reverie.deployments.docs``
(``make docs``) writes it with the other generated parts, and its ``--check`` and
tests/test_docs.py fail when the README differs from it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from typer._click.core import Command, Parameter
from typer.core import TyperArgument as Argument
from typer.core import TyperGroup
from typer.core import TyperOption as Option

from reverie.deployments.cli import _OneOf, command
from reverie.flows.catalog import Command as FlowCommand

# The commands that run flows: the options all their flows take are said once, on the
# command's row, and each flow's row has its own.
_FLOW_GROUPS = tuple(c.value for c in FlowCommand)


def commands_table(root: TyperGroup | None = None) -> str:
    root = root or command()
    rows = ["| command | what it does |", "|---|---|"]
    rows.append(_row(" ".join(["reverie", *_synopsis(root, ()), "..."]), _help(root)))
    for words, cmd in _commands(root, ["reverie"]):
        rows.append(_row(" ".join(words), _help(cmd)))
    return "\n".join(rows)


def _commands(group: TyperGroup, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    """Each command's synopsis and itself, in the order ``reverie --help`` lists them; a
    flow group first as one row of the options all its flows take, then a row per flow
    with its own; a group that runs alone (``reverie events``) as a row of its own."""
    for name, cmd in group.commands.items():
        if cmd.hidden:
            continue
        if not isinstance(cmd, TyperGroup):
            yield [*path, name, *_synopsis(cmd, ())], cmd
            continue
        if name in _FLOW_GROUPS:
            flows = list(cmd.commands.values())
            shared = [p.name for p in flows[0].params
                      if all(p.name in {q.name for q in f.params} for f in flows)]
            common = _Shared(flows[0], shared, cmd)
            yield [*path, name, "|".join(cmd.commands), *_synopsis(common, ())], common
            for flow_name, flow in cmd.commands.items():
                yield [*path, name, flow_name, "...", *_synopsis(flow, tuple(shared))], flow
            continue
        if cmd.invoke_without_command:
            yield [*path, name, *_synopsis(cmd, ())], cmd
        yield from _commands(cmd, [*path, name])


class _Shared:
    """A flow group's row: the options all its flows take, and the group's help."""

    def __init__(self, first: Command, shared: Sequence[str | None], group: TyperGroup) -> None:
        self.params = [p for p in first.params if p.name in shared]
        self.one_of: tuple[str, ...] = first.one_of if isinstance(first, _OneOf) else ()
        self.one_required = isinstance(first, _OneOf) and first.one_required
        self.help = group.help


def _synopsis(cmd: Command | _Shared, skip: tuple[str | None, ...]) -> list[str]:
    params = [p for p in cmd.params if p.name not in skip and "--help" not in p.opts]
    one_of: tuple[str, ...] = cmd.one_of if isinstance(cmd, _OneOf | _Shared) else ()
    words = [_arg(p) for p in params if isinstance(p, Argument)]
    grouped = [p for p in params if p.name in one_of]
    others = [p for p in params if isinstance(p, Option) and p.name not in one_of]
    for p in others:
        if p.required:
            words.append(_option(p))
    if grouped:
        inner = " | ".join(_option(p) for p in grouped)
        words.append(f"({inner})" if getattr(cmd, "one_required", False) else f"[{inner}]")
    words += [f"[{_option(p)}]" for p in others if not p.required]
    return words


def _arg(p: Parameter) -> str:
    name = p.metavar or (p.name or "").upper()
    return name if p.required else f"[{name}]"


def _option(p: Parameter) -> str:
    flag = p.opts[0]
    if isinstance(p, Option) and p.is_flag:
        return flag
    return f"{flag} {p.metavar}" + (" ..." if p.multiple else "")


def _help(cmd: Command | _Shared) -> str:
    text = " ".join((cmd.help or "").split())
    if cmd is command() or isinstance(cmd, TyperGroup) and not cmd.commands:
        opts = [p for p in cmd.params if isinstance(p, Option) and "--help" not in p.opts]
        text += "".join(f" `{p.opts[0]}`: {p.help}." for p in opts)
    return text


def _row(synopsis: str, what: str) -> str:
    return f"| `{synopsis.replace('|', chr(92) + '|')}` | {what.replace('|', chr(92) + '|')} |"

