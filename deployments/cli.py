"""The ``reverie`` command, on typer: each command declares its own options.

Start-up is held to the argparse CLI's (issue #39; ``benchmarks/cli_start.py``): the
store, its tables and the config (SQLAlchemy, pydantic) and heavy libraries (Prefect,
sentence-transformers) are imported inside the commands that need them, and only the
command named on the line is made into a click command (``_Commands``); help lists all.
Help is plain text (no rich): rich would cost every ``--help`` its import.
"""

from __future__ import annotations

import gc
import inspect
import json
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from dataclasses import asdict
from datetime import datetime
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

# typer 0.29 carries its own click and does not re-export its usage errors; they are
# caught here to print them as one line (typer's own handler prints a box).
from typer._click import exceptions as click_errors
from typer.core import TyperCommand, TyperGroup

from reverie.deployments.executable import unswept
from reverie.flows.catalog import (
    ALIASES,
    CONSOLIDATION_MODES,
    ENTRIES,
    RUN_TASKS,
    FlowEntry,
    FlowOption,
    aliases_help,
    canonical,
    names_help,
)
from reverie.models.errors import ReverieError
from reverie.models.ids import given_id
from reverie.models.timestamps import parse_timestamp

if TYPE_CHECKING:
    from typer._click.core import Command, Context

    from reverie.models.config import ConsolidationConfig
    from reverie.models.store import Store
    from reverie.models.tables import Memory
    from reverie.runner.report import RunReport

EXIT_OK, EXIT_REJECTED, EXIT_ERROR = 0, 1, 2
# Commands whose run is their start (``executable.unswept``): the store's stack imported
# (typer's parse already imports pydantic), then a few reads or one small write, or a
# profile's rows read as plain values (export). Flows, servers, benches, ingest,
# backfill and events (flush waits and retries) run long and keep the collector.
SHORT = frozenset({"init", "status", "undo", "consolidations", "blocks", "recall", "get",
                   "export"})
# Decisions `reverie consolidations` shows without --limit or --all.
CONSOLIDATIONS_SHOWN = 50
PROG = "reverie"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line; a user error (bad option, value or choice) is one line on
    stderr and SystemExit(2), as argparse did; a command's own error is exit code 2."""
    # A temporary Prefect server started for a local command would try to send usage
    # analytics, and log an ERROR when the machine has no route out.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    args = list(sys.argv[1:] if argv is None else argv)
    run = command().main
    # The root takes flags only: its first other word names the command.
    if next((word for word in args if not word.startswith("-")), None) in SHORT:
        run = unswept(run)
    try:
        code = run(args=args, prog_name=PROG, standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:
        print(exc.format_message(), file=sys.stderr)
        raise SystemExit(EXIT_ERROR) from None
    except click_errors.UsageError as exc:
        if (misplaced := _misplaced(exc)) is not None:
            print(f"reverie: {misplaced}", file=sys.stderr)
            return EXIT_ERROR
        where = exc.ctx.command_path if exc.ctx is not None else PROG
        print(f"{where}: {_said(exc)} (--help for usage)", file=sys.stderr)
        raise SystemExit(EXIT_ERROR) from None
    except ReverieError as exc:
        print(f"reverie: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (KeyboardInterrupt, typer.Abort):
        return 130
    return int(code or EXIT_OK)


def _said(exc: click_errors.UsageError) -> str:
    """click's complaint, in the words scripts and tests knew from argparse where they
    differ (an unknown option or a word too many)."""
    if isinstance(exc, click_errors.NoSuchOption):
        return f"unrecognized arguments: {exc.option_name}"
    extra = re.match(r"Got unexpected extra argument(?:s|\(s\))? \((.*)\)$", exc.message)
    return f"unrecognized arguments: {extra.group(1)}" if extra else exc.format_message()


def _misplaced(exc: click_errors.UsageError) -> str | None:
    """A flow's own option given to a flow that does not take it: which flows do, with
    the options that go with it (``--archive-below and --delete-below apply to `run
    forget` and `run cold` only``). None for any other error."""
    if not isinstance(exc, click_errors.NoSuchOption):
        return None
    option = next((o for o in FlowOption if f"--{o}" == exc.option_name), None)
    if option is None:
        return None

    def takers(o: FlowOption) -> list[str]:
        return [f"`{e.command} {e.name}`" for e in ENTRIES.values()
                if any(u.option is o for u in e.options)]

    kin = [f"--{o}" for o in FlowOption if takers(o) == takers(option)]
    return (f"{_and(kin)} {'applies' if len(kin) == 1 else 'apply'} to "
            f"{_and(takers(option))} only")


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


@cache
def command() -> TyperGroup:
    """The click command tree typer makes of the app, once per process; each command in
    it is made when first looked up (``_Commands``)."""
    return fresh_command()


def fresh_command() -> TyperGroup:
    """A tree of its own, for a caller that changes it (the README's relaxed parser)."""
    root = _typer()
    root.callback(help="Memory consolidation for AI agents.")(_root)
    group = typer.main.get_group(root)
    group.commands = _Commands(_COMMANDS)
    return group


class _Commands(MutableMapping[str, "Command"]):
    """The root's commands by name, in the order help lists them, each made into a click
    command only when looked up. A line runs one command: making the other 25 (every
    flow's options, every bench's) cost about 20 ms of each start. Help and the README's
    table look up every one, and get the same commands the eager tree had."""

    def __init__(self, makers: dict[str, Callable[[typer.Typer], None]]) -> None:
        self._makers = dict(makers)
        self._made: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self._made:
            self._made[name] = _made(self._makers[name])
        return self._made[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._makers.setdefault(name, lambda _app: None)
        self._made[name] = command

    def __delitem__(self, name: str) -> None:
        del self._makers[name]
        self._made.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def _made(register: Callable[[typer.Typer], None]) -> Command:
    """One command, registered on an app made like the root and made into a click
    command by the very typer calls that make a whole app's group of it."""
    app = _typer()
    register(app)
    if app.registered_commands:
        (info,) = app.registered_commands
        return typer.main.get_command_from_info(
            info, pretty_exceptions_short=app.pretty_exceptions_short,
            rich_markup_mode=app.rich_markup_mode)
    (group,) = app.registered_groups
    return typer.main.get_group_from_info(
        group, pretty_exceptions_short=app.pretty_exceptions_short,
        rich_markup_mode=app.rich_markup_mode, suggest_commands=app.suggest_commands)


# --- parameter types: each refuses bad input naming the field (click adds the name) ------


def _timestamp(text: str) -> datetime:
    try:
        return parse_timestamp(text)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not an ISO-8601 date or date-time (e.g. 2025-07-01 or "
            "2025-07-01T03:00:00Z)") from None


def _name(text: str) -> str:
    """A profile, session or memory id from the command line, in the form the store
    keeps names in (``ids.given_id``): flows are handed profile names, and refuse one
    in another Unicode form than they are stored in."""
    try:
        return given_id(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _profile_name(text: str) -> str:
    """A profile name from the command line: ``_name``, of a form a profile can have
    (a name no profile can have was answered "no profile named ...")."""
    from reverie.models.ids import profile_name

    try:
        return profile_name(_name(text))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


class Numbers(list[int]):
    """Whole numbers given as one option value, comma-separated (``--sizes 1000,10000``)."""

    def __str__(self) -> str:
        return ",".join(map(str, self))


class Names(list[str]):
    """Names given as one option value, comma-separated (``--flow-list full,decay``)."""

    def __str__(self) -> str:
        return ",".join(self)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise typer.BadParameter(f"{text!r} is not a whole number of at least 1")
    return value


def _names(text: str) -> Names:
    names = Names(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise typer.BadParameter(f"no conversation named: {text!r}")
    return names


def _numbers(bounds: tuple[int, int], noun: str) -> Callable[[str | list[int]], Numbers]:
    """A parser of comma-separated whole numbers (``noun``), each within ``bounds``."""
    low, high = bounds

    def parse(text: str | list[int]) -> Numbers:
        if isinstance(text, list):  # the default: typer passes it through the parser too
            return Numbers(text)
        try:
            numbers = Numbers(int(part.replace("_", "")) for part in text.split(",")
                              if part.strip())
        except ValueError:
            raise typer.BadParameter(f"{noun} must be whole numbers: {text!r}") from None
        if not numbers or min(numbers) < low:
            raise typer.BadParameter(f"{noun} must be at least {low}: {text!r}")
        if max(numbers) > high:
            raise typer.BadParameter(f"{noun} must be at most {high}: {text!r}")
        return numbers

    return parse


def _flow_list(text: str) -> Names:
    names = Names(canonical(n.strip()) for n in text.split(",") if n.strip())
    if not names:
        raise typer.BadParameter("names no flow")
    return names


class _OneOf(TyperCommand):
    """A command with options of which at most one may be given (and, when required,
    exactly one): ``--profile ... | --all``. Checked as the line is parsed, so a line
    that could never run fails as a parse error, like argparse's exclusive groups."""

    one_of: tuple[str, ...] = ()
    one_required: bool = False

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        flags = {p.name: p.opts[0] for p in self.params if p.name in self.one_of}
        given = [n for n in self.one_of if ctx.params.get(n) not in (None, False, ())]
        if len(given) > 1:
            raise click_errors.UsageError(
                f"argument {flags[given[1]]}: not allowed with argument {flags[given[0]]}", ctx)
        if self.one_required and not given:
            raise click_errors.UsageError(
                f"one of the arguments {' '.join(flags.values())} is required", ctx)
        return rest


def _one_of(*names: str, required: bool) -> type[TyperCommand]:
    return type("OneOf", (_OneOf,), {"one_of": names, "one_required": required})


class _FlowGroup(TyperGroup):
    """``reverie run NAME``: a flow the registry does not know is refused with the
    names it does, in argparse's words."""

    def resolve_command(
        self, ctx: Context, args: list[str]
    ) -> tuple[str | None, Command | None, list[str]]:
        if args:  # an old name (ALIASES) runs its new one
            args = [canonical(args[0]), *args[1:]]
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            raise click_errors.UsageError(
                f"argument FLOW: invalid choice: {args[0]!r} (choose from "
                f"{', '.join(self.commands)})", ctx)
        return super().resolve_command(ctx, args)

    def list_commands(self, ctx: Context) -> list[str]:
        return list(self.commands)  # the registry's order, not alphabetical


class Action(StrEnum):
    STATUS = "status"
    STOP = "stop"


class Transport(StrEnum):
    STDIO = "stdio"
    HTTP = "http"


class Scope(StrEnum):
    ALL = "all"
    SESSION = "session"


class Embeddings(StrEnum):
    RANDOM = "random"
    REAL = "real"


class SummarizerChoice(StrEnum):
    """``config.summarizer``'s values (``models.config.SummarizerName``, which a test
    holds this to): the config itself is not imported to start the command."""

    RULES = "rules"
    LLM = "llm"
    AUTO = "auto"


# Bounds of whole-number options, the agent API's where it has the same knob
# (``http_api``): what a line outside them asks for is a typo, not a request.
HISTORY_SHOWN = (1, 1000)  # status --limit: the API's consolidation status limit
RECALL_K = (1, 10_000)  # recall -k: the API's k
CONTEXT_CHARS = (0, 200_000)  # bench locomo --budget: the API's budget_chars
API_WORKERS = (1, 16)  # api and mcp --workers: REVERIE_API_WORKERS's (and MCP_'s) range
# The benches' sizes: beyond these a run would take days or more memory than a machine
# has, so a larger number is a slip of the keyboard.
BENCH_PROFILES = (1, 1000)  # bench updates/synthetic/api --profiles
BENCH_SIZES = (1, 10_000_000)  # bench synthetic/api --sizes, each (BENCHMARKS.md: 1M)
BENCH_CLIENTS = (1, 1024)  # bench api --clients, each: one thread per client
BENCH_CALLS = (1, 1_000_000)  # bench api --requests and --store-requests, per row
STORE_BATCH = (1, 10_000)  # bench api --store-batch: the store endpoint's memories per call
INGEST_SENTENCES = (0, 1_000_000)  # bench synthetic/api --ingest-sentences (0 skips it)
INGEST_RUNS = (1, 50)  # bench api --ingest-runs: pairs of runs, each of every sentence
EMBEDDING_SENTENCES = (16, 1_000_000)  # bench embedding --sentences: 16 make one batch
# events flush --timeout: 0 sends once, without waiting; an hour outlasts any restart of
# the API that waiting could ride out.
FLUSH_SECONDS = (0.0, 3600.0)
_sizes, _clients = _numbers(BENCH_SIZES, "sizes"), _numbers(BENCH_CLIENTS, "clients")


# --- options several commands share ---------------------------------------------------------


def _flag(*decls: str, **kwargs: Any) -> Any:
    """An on/off option: its default (off) goes unsaid in the help."""
    return typer.Option(*decls, show_default=False, **kwargs)


Json = Annotated[bool, _flag("--json", help="print the result as JSON")]
Profiles = Annotated[list[str] | None, typer.Option(
    "--profile", parser=_profile_name, metavar="P", help="a profile (repeat for several)")]
AllProfiles = Annotated[bool, _flag("--all", help="every profile in the store")]
Profile = Annotated[str, typer.Option("--profile", parser=_profile_name, metavar="P",
                                      help="the profile")]
Preset = Annotated[str | None, typer.Option(
    "--preset", metavar="NAME", help="configuration preset (default: 'default')")]
Summarizer = Annotated[SummarizerChoice, typer.Option(
    "--summarizer", metavar="rules|llm|auto", help="rules, llm or auto")]
JsonOut = Annotated[Path | None, typer.Option(
    "--json", metavar="OUT", help="also write the result as JSON")]
MarkdownOut = Annotated[Path | None, typer.Option(
    "--markdown", metavar="OUT", help="write the results table as markdown")]


def _version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("reverie")
    except PackageNotFoundError:  # run from a checkout that was never installed
        found = "unknown"
    print(f"reverie {found}")
    raise typer.Exit(EXIT_OK)


class _Stderr(logging.StreamHandler):
    """A log line as it is, on whatever ``sys.stderr`` is when it is written (a handler
    made by a first command in a process would keep a stream later ones replaced). A
    console handler, so that a progress bar's redirect (``runner.progress``) puts its
    lines above the bar, as it does Prefect's."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _root(
    verbose: Annotated[bool, _flag(
        "-v", "--verbose", help="show Prefect's logs of the runs (the UI always has them)")]
    = False,
    version: Annotated[bool, _flag(
        "--version", callback=_version, is_eager=True, help="print the version and exit")]
    = False,
) -> None:
    if not verbose:
        # Prefect's console shows warnings only; its run logs still reach the server (the
        # UI shows them). Read when Prefect is first imported, which no command has yet.
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
        # What a run in this process must still say here (a wait for a busy profile);
        # with -v the run's own log lines say it.
        console = logging.getLogger("reverie.console")
        if not console.handlers:
            console.addHandler(_Stderr())
            console.setLevel(logging.INFO)
            console.propagate = False


def _typer(help_: str | None = None, cls: type[TyperGroup] = TyperGroup,
           invoke_without_command: bool = False) -> typer.Typer:
    return typer.Typer(
        help=help_, cls=cls, rich_markup_mode=None, add_completion=False,
        pretty_exceptions_enable=False, no_args_is_help=not invoke_without_command,
        invoke_without_command=invoke_without_command,
        context_settings={"help_option_names": ["-h", "--help"]})


def _one(name: str, fn: Callable[..., int],
         cls: type[TyperCommand] | None = None) -> Callable[[typer.Typer], None]:
    def register(app: typer.Typer) -> None:
        app.command(name, cls=cls)(fn)
    return register


def _many(name: str, sub: Callable[[], typer.Typer]) -> Callable[[typer.Typer], None]:
    def register(app: typer.Typer) -> None:
        app.add_typer(sub(), name=name)
    return register


def _consolidate_app() -> typer.Typer:
    return _flows_app("consolidate", CONSOLIDATION_MODES,
                      "Run full or lightweight consolidation in this process (against "
                      "PREFECT_API_URL if set); --not-done takes only the profiles not yet "
                      "finished for that --as-of.")


def _run_app() -> typer.Typer:
    return _flows_app("run", RUN_TASKS, "Run a maintenance flow in this process (against "
                      "PREFECT_API_URL if set).")


def _events_app() -> typer.Typer:
    events = _typer(invoke_without_command=True)
    events.callback(help=inspect.getdoc(_events))(_events)
    events.command("flush")(_events_flush)
    return events


def _bench_app() -> typer.Typer:
    bench = _typer("Measure what consolidation does to a store.")
    for name, fn in (("locomo", _bench_locomo), ("updates", _bench_updates),
                     ("synthetic", _bench_synthetic), ("api", _bench_api),
                     ("embedding", _bench_embedding)):
        bench.command(name)(fn)
    return bench


# --- flows: one command per flow of the registry, with the options it takes ---------------


def _flows_app(command: str, names: Sequence[str], help_: str) -> typer.Typer:
    example = next((n for n in names if ENTRIES[n].options), names[0])
    renamed = [old for old, new in ALIASES.items() if new in names]
    runs = _typer(f"{help_} A flow's own options: `reverie {command} {example} --help` "
                  "(and so on)." + (f" Old names: {aliases_help()}." if renamed else ""),
                  cls=_FlowGroup)
    for name in names:
        entry = ENTRIES[name]
        runs.command(name, cls=_one_of("profile", "all_", required=True),
                     help=entry.summary)(_flow_command(entry))
    return runs


def _run_options(
    profile: Profiles = None,
    all_: AllProfiles = False,
    as_of: Annotated[datetime | None, typer.Option(
        "--as-of", parser=_timestamp, metavar="ISO",
        help="the 'now' of the run, ISO-8601 (default: now)")] = None,
    dry_run: Annotated[bool, _flag(
        "--dry-run", help="report what would change; write nothing")] = False,
    preset: Annotated[str | None, typer.Option(
        "--preset", metavar="NAME",
        help="configuration preset (default: REVERIE_PRESET or 'default')")] = None,
    not_done: Annotated[bool, _flag(
        "--not-done", help="only the selected profiles this flow has not finished for "
        "--as-of (re-run after some profiles failed)")] = False,
    json_: Json = False,
) -> None:
    """What every flow run takes: which profiles, its 'now', dry run, and knobs (the
    signature is read, never called)."""


# Each flow option: its type and metavar (its help, per flow, is the registry's).
_FLOW_OPTION_TYPES: dict[FlowOption, tuple[Any, dict[str, Any]]] = {
    FlowOption.SCOPE: (Scope | None, {"metavar": "all|session"}),
    FlowOption.SESSION: (str | None, {"parser": _name, "metavar": "S"}),
    FlowOption.MIN_AGE_DAYS: (float | None, {"metavar": "N"}),
    FlowOption.ARCHIVE_BELOW: (float | None, {"metavar": "R"}),
    FlowOption.DELETE_BELOW: (float | None, {"metavar": "R"}),
    FlowOption.APPROVE_DELETION: (bool, {}),
    FlowOption.MIGRATE_AFTER_DAYS: (float | None, {"metavar": "N"}),
    FlowOption.TTL_DAYS: (float | None, {"metavar": "N"}),
}


def _flow_command(entry: FlowEntry) -> Callable[..., int]:
    """``reverie run NAME``'s function: the common options, then the flow's own from the
    registry, each becoming the flow's keyword argument it names."""

    def run(**options: Any) -> int:
        return _run_entry(entry, options)

    params = list(inspect.signature(_run_options, eval_str=True).parameters.values())
    for use in entry.options:
        kind, extra = _FLOW_OPTION_TYPES[use.option]
        default = False if kind is bool else None
        params.append(inspect.Parameter(
            use.option.value.replace("-", "_"), inspect.Parameter.KEYWORD_ONLY,
            default=default,
            annotation=Annotated[kind, typer.Option(
                f"--{use.option.value}", help=use.help, show_default=False, **extra)]))
    run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # read by typer
        [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params])
    run.__name__ = entry.name.replace("-", "_")
    run.__doc__ = entry.summary
    return run


def _run_entry(entry: FlowEntry, options: dict[str, Any]) -> int:
    # Enums as their plain values: the flow's own parameters validate them again.
    given = {use.option: _plain(options[use.option.value.replace("-", "_")])
             for use in entry.options}
    extra = {use.parameter: given[use.option] for use in entry.options}
    if FlowOption.SCOPE in given and given[FlowOption.SCOPE] is None:
        extra["scope"] = "session" if given.get(FlowOption.SESSION) else "all"
    archive, delete = given.get(FlowOption.ARCHIVE_BELOW), given.get(FlowOption.DELETE_BELOW)
    if FlowOption.ARCHIVE_BELOW in given:
        from reverie.models.config import DEFAULT, with_forget_thresholds

        with_forget_thresholds(DEFAULT, archive, delete)  # one clear line
    if FlowOption.MIGRATE_AFTER_DAYS in given:
        from reverie.flows.cold_tier import with_cold_tier
        from reverie.models.config import DEFAULT

        with_cold_tier(DEFAULT, given[FlowOption.MIGRATE_AFTER_DAYS],
                       given.get(FlowOption.TTL_DAYS))  # one clear line
    if entry.asks_approval:
        (approve,) = (u.parameter for u in entry.options
                      if u.option is FlowOption.APPROVE_DELETION)
        extra[approve] = _deletion_approved(
            bool(given[FlowOption.APPROVE_DELETION]), options["dry_run"], options["preset"],
            archive, delete)
    return _run_flow(entry.name, options, **extra)


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, StrEnum) else value


def _deletion_approved(approved: bool, dry_run: bool, preset_name: str | None,
                       archive: float | None, delete_below: float | None) -> bool:
    """Whether `run forget` deletes without pausing for approval. A run that would delete
    with no Prefect API configured is refused before it starts: it would pause on a
    temporary server no one can answer, and hang until its approval times out."""
    from reverie.models.config import preset, with_forget_thresholds
    from reverie.models.settings import get_settings
    from reverie.runner.event_delivery import api_configured

    if approved or dry_run:
        return approved
    base = preset(preset_name) if preset_name else get_settings().consolidation_config()
    delete = with_forget_thresholds(base, archive, delete_below).forget.delete_threshold
    if delete == 0.0:
        return False
    if not api_configured():
        raise ReverieError(
            f"forget would delete memories below relevance {delete:g}, which "
            "needs approval, and no Prefect API is configured to ask it through: add "
            "--approve-deletion, or set PREFECT_API_URL to pause the run for approval")
    print(f"forget: deleting below {delete:g} waits for approval: the run "
          "pauses and logs its id; answer in the Prefect UI (Resume) or with "
          "`reverie approve <run id>` (--reject deletes none)", file=sys.stderr)
    return False


def _run_flow(name: str, options: dict[str, Any], **extra: Any) -> int:
    from reverie.models.config import preset

    config: ConsolidationConfig | None = (
        preset(options["preset"]) if options["preset"] else None)
    as_of = options["as_of"]
    selected = _selected(options["profile"], options["all_"])
    # An unknown profile is the user's error: say so before a flow run starts.
    _store().resolve_profiles(selected)
    if options["not_done"]:
        if as_of is None:
            raise ReverieError("--not-done needs --as-of: the run whose profiles to finish")
        selected = _not_done(name, selected, as_of)
        if not selected:
            print(f"every selected profile has finished {name} as of {as_of}")
            return EXIT_OK
    report = run_flow(name, selected, as_of, options["dry_run"], config, **extra)
    if options["json_"]:
        _print_json(asdict(report))
        return EXIT_OK
    for step in report.steps:
        print(
            f"{step.profile:<20} {step.step:<17} examined {step.examined:>6}  "
            f"changed {step.changed:>5}  {step.seconds:.3f}s"
        )
        for note in step.notes:
            print(f"{'':<20} note: {note}")
    verb = "would change" if report.dry_run else "changed"
    print(f"{report.flow} as of {report.as_of}: {verb} {report.changed()} things"
          + (" (dry run: nothing written)" if report.dry_run else "")
          + (f"; a real run waits for {report.waits_for}" if report.waits_for else ""))
    return EXIT_OK


def _not_done(name: str, selected: str | list[str] | None, as_of: datetime) -> list[str]:
    """The selected profiles with no finished run of flow ``name`` at ``as_of`` (a run
    records a profile only when all its steps succeeded)."""
    from reverie.flows.catalog import FLOWS
    from reverie.models.repositories.runs import run_history
    from reverie.models.timestamps import to_utc_naive

    store = _store()
    with store.reading_all() as s:
        done = {r.profile_id for r in run_history(
            s, flow=FLOWS[name].name, as_of=to_utc_naive(as_of), limit=None)}
    return [p for p in store.resolve_profiles(selected) if p not in done]


def run_flow(
    name: str,
    profile: str | list[str] | None,
    as_of: datetime | None,
    dry_run: bool,
    config: ConsolidationConfig | None,
    **extra: Any,
) -> RunReport:
    """Run a flow by its short name in this process (against PREFECT_API_URL if set)."""
    from reverie.runner.loading import first_load

    with first_load():
        from reverie.deployments.local_server import local_api
        from reverie.flows.catalog import FLOWS
        from reverie.runner.runtime import wait_for_run_history

        flow = FLOWS[name]
    with local_api():
        report = flow(profile=profile, as_of=as_of, dry_run=dry_run, config=config, **extra)
    wait_for_run_history(report.run_id)
    return report


# --- helpers ------------------------------------------------------------------------------


def _store() -> Store:
    """The configured store, which must exist: reading a SQLite store that is not there
    would silently create an empty one (say, run from another folder). Opening it
    raises StoreMissingError anyway (``models.db``); this says so before any work."""
    from reverie.models.db import _missing
    from reverie.models.store import Store

    store = Store()
    if not store.exists():
        raise _missing(store.url)
    return store


def _say_created(store: Store) -> None:
    from reverie.models.settings import display_url

    print(f"created a new store at {display_url(store.url)} (id {store.id})",
          file=sys.stderr, flush=True)


def _selected(profile: list[str] | None, all_: bool) -> str | list[str] | None:
    if all_ or not profile:
        return None
    return profile[0] if len(profile) == 1 else list(profile)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _command_line(ctx: Context, shown: dict[str, str] | None = None) -> str:
    """The command line that reproduces this bench run, from the options it was given:
    every option with a value (in declaration order), flags only when set, output files
    left out. ``shown`` replaces a value that must not be printed as given."""
    words = [ctx.command_path]
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if value is None or value is False or param.name in ("json_out", "markdown"):
            continue
        words.append(param.opts[0])
        if value is True:
            continue
        if param.name in (shown or {}):
            words.append((shown or {})[param.name or ""])
        elif isinstance(value, float):
            words.append(f"{value:g}")
        else:
            words.append(str(value))
    return " ".join(words)


# --- commands -------------------------------------------------------------------------


def _ingest(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="a JSONL file of memories "
                                         "(and edges), or a backup `reverie export` wrote")],
    profile: Annotated[str | None, typer.Option(
        "--profile", parser=_profile_name, metavar="P",
        help="profile for records that do not name one")] = None,
    json_: Json = False,
) -> int:
    """Store the memories (and edges) of a JSONL file, creating the store if there
    is none and a record to write (and saying so). A backup that `reverie export`
    wrote restores its profile exactly, all or nothing, into a store without that
    profile."""
    from reverie.models.backup import is_backup

    # An unreadable file is refused as the line is parsed (typer's Path checks it).
    if file.is_dir():
        raise ReverieError(f"{file} is a directory, not a JSONL file")
    if not file.is_file():
        raise ReverieError(f"no such file: {file}")
    if is_backup(file):
        return _restore(file, profile, json_)
    from reverie.engines.embedding import embedder_for
    from reverie.models.ingest import ingest_jsonl
    from reverie.models.store import Store
    from reverie.runner.event_delivery import deliver, wanted
    from reverie.runner.progress import Bar, on_terminal

    store = Store()
    embedder = embedder_for(store.settings)

    total = None
    if on_terminal():
        # Counted first for the bar alone (a quick pass): with its total it says how far
        # the ingest is and how long the rest takes. read_jsonl skips blank lines too.
        with file.open("rb") as handle:
            total = sum(1 for line in handle if line.strip())
    with Bar(total, "ingest", unit="record") as bar:
        report = ingest_jsonl(store, file, embedder, profile,
                              progress=bar.update if bar.active else False,
                              queue_events=wanted())
    if report.created:
        _say_created(store)
    if report.queued_events:
        deliver(store.url)
    for error in report.errors:
        print(f"{file}: {error}", file=sys.stderr)
    if not (report.accepted or report.edges or report.errors):
        # No record at all (no line, or blank lines only): likelier the wrong file, or
        # one cut short, than an ingest meant to store nothing. Nothing in it is wrong,
        # so it exits 0, as other commands with nothing to do do.
        print(f"{file} holds no memories", file=sys.stderr)
    if json_:
        _print_json(
            {"stored": report.stored, "updated": report.updated, "unchanged": report.unchanged,
             "edges": report.edges, "rejected": [str(e) for e in report.errors],
             "released": report.released}
        )
    else:
        print(
            f"stored {report.stored}, updated {report.updated}, unchanged {report.unchanged}, "
            f"edges {report.edges}, rejected {len(report.errors)}"
        )
        if report.released:
            n = len(report.released)
            print(f"released {n} consolidation{'s' if n != 1 else ''} that held a memory given "
                  f"new content (the next run decides again): {', '.join(report.released)}")
    return EXIT_REJECTED if report.errors else EXIT_OK


def _restore(file: Path, profile: str | None, json_: bool) -> int:
    """A backup (``reverie export``) restores its profile as it was, all or nothing."""
    from reverie.models.backup import restore_file
    from reverie.models.store import Store

    store = Store()
    if store.create():  # restoring is ingesting: it may make the store
        _say_created(store)
    restored = restore_file(store.url, file, profile)
    if json_:
        _print_json({"restored": restored.profile, "rows": restored.rows})
    else:
        counts = ", ".join(f"{n} {table}" for table, n in restored.rows.items())
        print(f"restored profile {restored.profile}: {counts}")
    return EXIT_OK


def _init(json_: Json = False) -> int:
    """Create the configured store (REVERIE_DATABASE_URL) if it is not there, and print
    its id. Only init, ingest and demo create stores."""
    from reverie.models.settings import display_url
    from reverie.models.store import Store

    store = Store()
    created = store.create()
    if json_:
        _print_json({"store": display_url(store.url), "id": store.id, "created": created})
    elif created:
        _say_created(store)
    else:
        print(f"a store is already at {display_url(store.url)} (id {store.id}); "
              "left as it is", file=sys.stderr)
    return EXIT_OK


def _approve(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="the paused flow run's id")],
    reject: Annotated[bool, _flag(
        "--reject", help="delete none (the run still archives as configured)")] = False,
    reason: Annotated[str, typer.Option(
        "--reason", metavar="TEXT", help="why, kept in the run's log and artifact")] = "",
) -> int:
    """Answer a forget run paused for deletion approval."""
    from uuid import UUID

    from prefect.exceptions import FlowPauseTimeout, NotPausedError, ObjectNotFound
    from prefect.flow_runs import resume_flow_run

    from reverie.runner.event_delivery import api_configured

    if not api_configured():
        raise ReverieError("no Prefect API is configured: set PREFECT_API_URL to the server "
                           "the run is paused on")
    try:
        run = UUID(run_id)
    except ValueError:
        raise ReverieError(f"not a flow run id: {run_id!r}") from None
    try:
        resume_flow_run(run, run_input={"approve": not reject, "reason": reason})
    except ObjectNotFound:
        raise ReverieError(f"no flow run {run}") from None
    except NotPausedError:
        raise ReverieError(f"flow run {run} is not paused") from None
    except FlowPauseTimeout:
        raise ReverieError(f"flow run {run} waited too long and can no longer resume") \
            from None
    except RuntimeError as exc:  # Prefect refused the answer (e.g. it fits no form)
        raise ReverieError(f"flow run {run}: {exc}") from None
    print(f"{run}: deletion {'rejected' if reject else 'approved'}")
    return EXIT_OK


def _backfill(
    flow: Annotated[str, typer.Argument(
        metavar="FLOWS", help=f"{names_help()}; or several joined by commas (decay,full), "
        f"run on each date in the order a day's schedules run them ({aliases_help()})")],
    start: Annotated[datetime, typer.Option(
        "--from", parser=_timestamp, metavar="DATE", help="first as_of, ISO-8601")],
    end: Annotated[datetime, typer.Option(
        "--to", parser=_timestamp, metavar="DATE", help="last as_of, ISO-8601 (included)")],
    every: Annotated[str, typer.Option(
        "--every", metavar="1d", help="step between dates: 30m, 12h, 1d, 1w")] = "1d",
    profile: Profiles = None,
    all_: AllProfiles = False,
    wait: Annotated[bool, _flag(
        "--wait", help="through Prefect: wait until its replay runs have ended (exit 1 if "
        "any did not complete)")] = False,
    json_: Json = False,
) -> int:
    """Run a flow once per date over a range, the dates in order (FLOWS: one flow, or
    several joined by commas, each date's in schedule order): one replay run per profile
    through Prefect, or here; resumable. --wait waits for the replay runs (exit 1 if one
    did not complete)."""
    from reverie.deployments.backfill import backfill, parse_every

    report = backfill(flow, start, end, parse_every(every), _selected(profile, all_))
    if json_:
        ended = _ended(wait, report)
        _print_json({**asdict(report), "ended": ended})
        return EXIT_REJECTED if set((ended or {}).values()) - {"COMPLETED"} else EXIT_OK
    if report.where == "local":
        print(
            f"backfill of {report.flow} via {report.where}: {len(report.created)} run(s) made, "
            f"{len(report.skipped)} date(s) already done"
        )
        from reverie.runner.progress import on_terminal

        if not (sys.stdout.isatty() and on_terminal()):  # else each was shown as it ran
            for when in report.created:
                print(f"  ran {when}")
        _say_out_of_order(report)
        return EXIT_OK
    print(
        f"backfill of {report.flow} via {report.where}: {len(report.created)} date(s) to "
        f"replay in {len(report.runs)} run(s), one per profile; "
        f"{len(report.skipped)} date(s) already done"
    )
    for name in report.running:
        print(f"  {name}: its replay of {report.flow} is still queued or running")
    _say_out_of_order(report)
    return _wait_for_backfill(wait, report)


def _say_out_of_order(report: Any) -> None:
    late = report.out_of_order
    if late:
        print(f"  out of schedule order: {len(late)} date(s) from {late[0]} come before a run "
              "already in a profile's history, and run after it (the store will not end "
              "where runs in date order would have left it)")


def _ended(wait: bool, report: Any) -> dict[str, str] | None:
    """``--wait`` through Prefect: each replay run the backfill depends on, once all have
    ended, with its final state; None without ``--wait`` or when it ran here."""
    from reverie.deployments.backfill import replays_to_wait_for, wait_for_replays

    if not wait or report.where == "local":
        return None
    return wait_for_replays(replays_to_wait_for(report, _store()))


def _wait_for_backfill(wait: bool, report: Any) -> int:
    ended = _ended(wait, report)
    if ended is None:
        return EXIT_OK
    failed = {run: state for run, state in ended.items() if state != "COMPLETED"}
    print(f"backfill of {report.flow}: {len(ended) - len(failed)} replay run(s) completed, "
          f"{len(failed)} did not")
    for run, state in sorted(failed.items()):
        print(f"  replay run {run}: {state}")
    return EXIT_REJECTED if failed else EXIT_OK


def _server(action: Annotated[Action, typer.Argument(metavar="status|stop")]) -> int:
    """The local Prefect server that local commands share."""
    from reverie.deployments.local_server import prefect_home, running, stop

    home = prefect_home()
    if action is Action.STOP:
        stopped = stop(home)
        print(f"stopped the local Prefect server at {stopped.url}" if stopped
              else "no local Prefect server runs")
        return EXIT_OK
    server = running(home)
    if server is None:
        print(f"no local Prefect server runs (PREFECT_HOME {home}); the next local "
              "command starts one")
    else:
        print(f"local Prefect server at {server.url} (pid {server.pid}, database in "
              f"{home}); stops after {server.idle_seconds:g} s unused")
    return EXIT_OK


def _status(
    profile: Annotated[str | None, typer.Option(
        "--profile", parser=_profile_name, metavar="P", help="one profile (default: all)")] = None,
    limit: Annotated[int, typer.Option(
        "--limit", metavar="N", min=HISTORY_SHOWN[0], max=HISTORY_SHOWN[1],
        help="runs of history to show")] = 20,
    json_: Json = False,
) -> int:
    """Per profile and flow: the last run, what it changed, the next scheduled run (with
    a Prefect API); the backfills in progress (each replay run, its runs done of its
    total); the runs that ended Failed or Crashed (with a Prefect API); and the history
    of recent runs."""
    from reverie.deployments.status import as_json, collect, render
    from reverie.models.settings import display_url

    store = _store()
    status = collect(store, profile, limit)
    if json_:
        _print_json(as_json(status))
    else:
        print(f"store: {display_url(store.url)}")
        print(render(status))
    return EXIT_OK


def _session_end(
    profile: Profile,
    session: Annotated[str | None, typer.Option(
        "--session", parser=_name, metavar="S", help="the session's id")] = None,
) -> int:
    """Record the end of a profile's session (full consolidation follows, via the
    triggers)."""
    from reverie.runner.event_delivery import api_configured, end_session

    store = _store()
    store.resolve_profiles(profile)
    ended = end_session(store, profile, session)
    if not ended.counted:
        print(f"{profile}: session {session} had ended already (session {ended.count}): "
              "not counted again")
        return EXIT_OK
    print(f"{profile}: session {ended.count} ended")
    if not api_configured():
        # The consolidation that follows a session end is a Prefect trigger's.
        print(f"no Prefect API is configured (PREFECT_API_URL): no run follows; "
              f"`reverie consolidate full --profile {profile}` consolidates now",
              file=sys.stderr)
    return EXIT_OK


def _alerts(
    block: Annotated[str | None, typer.Option(
        "--block", metavar="TYPE/NAME",
        help="the block, e.g. slack-webhook/ops (default $REVERIE_ALERT_BLOCK)")] = None,
    off: Annotated[bool, _flag("--off", help="pause the automation")] = False,
) -> int:
    """Announce failed and crashed Reverie runs through a Prefect notification block (the
    reverie-run-failed automation)."""
    from reverie.deployments.alerts import ensure_failure_alerts
    from reverie.runner.event_delivery import api_configured

    if not api_configured():
        raise ReverieError("alerts live in a Prefect server: set PREFECT_API_URL")
    state = ensure_failure_alerts("" if off else block)
    if state.enabled:
        print(f"failed and crashed Reverie runs are announced through {state.block}")
    else:
        print("alerts are off" + (" (automation paused)" if state.automation_id else "")
              + "; --block TYPE/NAME or REVERIE_ALERT_BLOCK turns them on")
    return EXIT_OK


def _crash_detection() -> int:
    """Keep, on the Prefect server of PREFECT_API_URL, the two automations that end
    Crashed a Reverie run whose process is gone (reverie-run-unresponsive,
    reverie-run-not-started), as `reverie serve` keeps them on its own: for a server you
    run yourself. Its workers must send heartbeats (PREFECT_FLOWS_HEARTBEAT_FREQUENCY)."""
    from reverie.deployments.crash_detection import ensure_crash_detection
    from reverie.models.settings import get_settings
    from reverie.runner.event_delivery import api_configured

    if not api_configured():
        raise ReverieError("crash detection lives in a Prefect server: set PREFECT_API_URL")
    found = ensure_crash_detection()
    print(f"a Reverie run whose process is gone is marked Crashed {found.unresponsive_seconds}"
          f" s after its last heartbeat (Pending: after {found.not_started_seconds} s); "
          "workers must send one more often: PREFECT_FLOWS_HEARTBEAT_FREQUENCY="
          f"{get_settings().heartbeat_seconds:g}")
    return EXIT_OK


def _events(ctx: typer.Context, json_: Json = False) -> int:
    """Prefect events waiting in the store (kept while the API was down), per profile
    (`reverie events flush` sends them)."""
    if ctx.invoked_subcommand is not None:
        return EXIT_OK
    from reverie.models.outbox import waiting

    pending = waiting(_store().url)
    if json_:
        _print_json([asdict(p) for p in pending])
    elif not pending:
        print("no events waiting")
    else:
        for p in pending:
            print(f"{p.profile}: {p.events} event(s) waiting, "
                  f"the oldest from {p.oldest:%Y-%m-%d %H:%M:%S} UTC")
    return EXIT_OK


def _events_flush(
    timeout: Annotated[float, typer.Option(
        "--timeout", metavar="SECONDS", min=FLUSH_SECONDS[0], max=FLUSH_SECONDS[1],
        help="seconds to keep sending, to wait for another sender and to try again while "
        "the API does not answer (0: send once)")] = 30.0,
    json_: Json = False,
) -> int:
    """Send the waiting events to the Prefect API ($PREFECT_API_URL), oldest first. Exit
    code 0 once none is left."""
    import time

    from reverie.models.errors import TransientError
    from reverie.models.transient import retrying
    from reverie.runner.event_delivery import FlushResult, Outcome, flush

    url = _store().url
    give_up = time.monotonic() + timeout
    results: list[FlushResult] = []

    class NotYet(TransientError):
        """Events are left and --timeout lasts: flush again after ``retry_after``."""
    # Another process is sending (it takes everything before it stops): look again
    # soon. The API did not answer in time (a server starting or restarting): look
    # again less often each time. Either while --timeout lasts, no wait beyond it.
    pauses = iter(min(0.5 * 2**n, 5.0) for n in range(64))
    pause = 0.5

    def attempt() -> FlushResult:
        nonlocal pause
        result = flush(url, budget=max(0.0, give_up - time.monotonic()))
        results.append(result)
        if result.outcome is Outcome.UNREACHABLE:
            pause = next(pauses, 5.0)
        if result.outcome in (Outcome.BUSY, Outcome.UNREACHABLE):
            left = give_up - time.monotonic()
            if left > 0:
                not_yet = NotYet(result.outcome.value)
                not_yet.retry_after = min(pause, left)
                raise not_yet
        return result

    try:
        # No bound on attempts: --timeout is the bound (a store lock waited on counts).
        retrying(attempt, attempts=None, first=0.5, cap=5.0, timeout=max(timeout, 0.01))
    except NotYet:
        pass  # --timeout ran out: the last result says what is left
    result = results[-1]
    sent = sum(r.sent for r in results)
    if json_:
        _print_json({"outcome": result.outcome.value, "sent": sent,
                     "pending": result.pending, "error": result.error})
    else:
        print(f"sent {sent}, waiting {result.pending}")
    if result.pending == 0:
        return EXIT_OK
    reasons = {
        Outcome.UNREACHABLE: f"the Prefect API did not take them ({result.error}) in "
                             f"{timeout:g} s; they stay in the store: flush again "
                             "once it answers",
        Outcome.NO_API: "no Prefect API is configured: set PREFECT_API_URL",
        Outcome.BUSY: "another process is still sending them",
        Outcome.INCOMPLETE: "time ran out: flush again to send the rest",
    }
    print(f"reverie: {result.pending} event(s) not sent: {reasons.get(result.outcome, '')}",
          file=sys.stderr)
    return EXIT_ERROR


def _undo(
    id_: Annotated[str, typer.Argument(
        metavar="ID", parser=_name,
        help="a consolidation id (c-...) or the id of the summary it made")],
    profile: Annotated[str, typer.Option(
        "--profile", parser=_profile_name, metavar="P",
        help="the profile the consolidation belongs to")],
    json_: Json = False,
) -> int:
    """Undo a consolidation of a profile (by its c-... id or its summary's id; an id of
    another profile is not found): the originals return to the state they were in, the
    summary and its edges go (the audit keeps its text). Undoing twice is harmless, and
    later runs do not redo it."""
    from reverie.models.repositories.summaries import undo
    from reverie.models.tables import Operation
    from reverie.models.timestamps import utcnow

    with _store().writing(profile) as tx:
        result = undo(tx, id_, utcnow())
    if json_:
        _print_json(asdict(result))
    elif result.already_undone:
        print(f"{result.consolidation_id} was already undone; nothing changed")
    else:
        print(
            f"undid {result.operation} {result.consolidation_id} in {result.profile}: "
            f"{len(result.restored)} memories restored"
            + ("" if not result.summary_id else
               # A supersession's "summary" is the newest memory: it stays, as it was.
               f", {result.summary_id} stays hot as it was"
               if result.operation == Operation.SUPERSEDE.value
               else f", summary {result.summary_id} removed")
        )
    return EXIT_OK


def _consolidations(
    profile: Profile,
    limit: Annotated[int | None, typer.Option(
        "--limit", parser=_count, metavar="N",
        help=f"show the newest N (default {CONSOLIDATIONS_SHOWN})")] = None,
    all_: Annotated[bool, _flag("--all", help="show every decision")] = False,
    why: Annotated[bool, _flag(
        "--why", help="also the rule that grouped each decision's members and each "
        "member's similarity (or heat) to the group")] = False,
    json_: Annotated[bool, _flag(
        "--json", help="print {profile, total, shown, consolidations: [...]} as JSON, "
        "each decision with its summary_text and parameters (rule, similarities)")] = False,
) -> int:
    """List a profile's consolidation decisions (merges, compressions, clusters, cold
    notes, supersessions, forgetting), newest first: each with its id, date, operation, summary id,
    member count and the summary's text (an undone one's kept words), the newest 50
    unless --limit N or --all, ending with the total. --why adds the rule that grouped
    each decision's members, its knobs and each member's similarity to the
    representative, seed or centroid (a cold note's: its heat)."""
    store = _store()
    store.resolve_profiles(profile)
    from reverie.models.repositories.audit import (
        consolidation_count,
        consolidations,
        summary_texts,
    )

    shown = None if all_ else limit or CONSOLIDATIONS_SHOWN
    with store.reading(profile) as tx:
        rows = consolidations(tx, shown)
        total = len(rows) if shown is None or len(rows) < shown else consolidation_count(tx)
        texts = summary_texts(tx, rows)
    if json_:
        _print_json({
            "profile": profile, "total": total, "shown": len(rows),
            "consolidations": [
                {**r.model_dump(mode="json"), "summary_text": texts.get(r.id)} for r in rows
            ],
        })
        return EXIT_OK
    if not rows:
        print(f"no consolidation decisions yet for {profile}")
        return EXIT_OK
    width = shutil.get_terminal_size((120, 24)).columns
    wide = max(len(r.id) for r in rows)  # a released decision's id is longer
    print(f"{'id':<{wide}}  {'created':<10}  {'operation':<9}  {'summary':<18}  "
          f"{'members':>7}  summary text")
    for r in rows:
        undone = "" if r.undone_at is None else f"{r.undone_at:%Y-%m-%d %H:%M}"
        state = "" if not undone else (
            f"[released by an ingest {undone}] " if "released" in (r.parameters or {})
            else f"[undone {undone}] ")
        head = (f"{r.id:<{wide}}  {r.created_at:%Y-%m-%d}  {r.operation:<9}  "
                f"{r.summary_id or '-':<18}  {len(r.member_ids):>7}  ")
        text = " ".join(texts.get(r.id, "-").split())  # one line per decision
        print(head + _clipped(state + text, max(40, width - len(head))))
        if why:
            for line in _why(r.parameters or {}):
                print(f"    {line}")
    if len(rows) < total:
        print(f"showing {len(rows)} of {total}, newest first; --limit N or --all for more")
    else:
        print(f"{total} decision{'s' if total != 1 else ''}, newest first")
    return EXIT_OK


def _clipped(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# Audit parameters that say how to undo a decision or what it absorbed, not why.
_NOT_WHY = frozenset({"prior", "absorbed", "undone_summary", "released", "rule", "similarities",
                      "heats", "conflicts"})


def _why(parameters: dict[str, Any]) -> list[str]:
    """A decision's audit, in lines: its rule, its knobs, each member's similarity to
    the group (or heat, for cold notes) and, for a supersession, what each disagrees on."""
    lines = [f"rule: {parameters['rule']}"] if parameters.get("rule") else []
    knobs = [f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}"
             for k, v in parameters.items() if k not in _NOT_WHY]
    if knobs:
        lines.append("knobs: " + ", ".join(knobs))
    for key, label in (("similarities", "similarity"), ("heats", "heat")):
        values = parameters.get(key) or {}
        if values:
            lines.append(f"{label}: " + ", ".join(
                f"{mid} {value:.3f}" for mid, value in values.items()))
    conflicts = parameters.get("conflicts") or {}
    if conflicts:
        lines.append("conflicts: " + ", ".join(f"{mid} {kind}" for mid, kind in conflicts.items()))
    if parameters.get("absorbed"):
        lines.append("absorbed: " + ", ".join(parameters["absorbed"]))
    return lines


def _blocks(profile: Profile, json_: Json = False) -> int:
    """Show a profile's Core Memory blocks."""
    store = _store()
    store.resolve_profiles(profile)
    from reverie.models.repositories.blocks import blocks as blocks_of

    with store.reading(profile) as tx:
        blocks = blocks_of(tx)
    if json_:
        _print_json([b.model_dump() for b in blocks])
        return EXIT_OK
    from reverie.models.block_text import block_rules
    from reverie.models.settings import get_settings

    rules = block_rules(get_settings().consolidation_config().blocks)
    if not blocks:
        print(f"no blocks yet for {profile}: run `reverie consolidate` first")
    for b in blocks:
        print(f"## {b.block_type}  (v{b.version}, {len(b.content)} chars, {b.mode})")
        print(f"rule: {rules.get(b.block_type, '-')}")
        print(b.content or "(empty: no memory meets the rule yet)")
        print()
    return EXIT_OK


def _recall(
    query: Annotated[str, typer.Argument(metavar="QUERY", help="what to look for")],
    profile: Profile,
    k: Annotated[int, typer.Option("-k", metavar="N", min=RECALL_K[0], max=RECALL_K[1],
                                   help="how many memories")] = 5,
    deep: Annotated[bool, _flag("--deep", help="search the cold tier too")] = False,
    track: Annotated[bool, _flag("--track", help="count the hits as accessed")] = False,
    json_: Json = False,
) -> int:
    """Find the memories most similar to a query; --deep adds the cold tier and says
    which summary replaced a hit."""
    from reverie.engines.ranking import day
    from reverie.recall.search import recall

    hits = recall(_store(), profile, query, k, deep, track)
    if json_:
        _print_json([
            {"score": h.score, **_memory_json(h.memory), "text": h.text,
             "matched": [_memory_json(o) for o in h.members] if h.excerpted else []}
            for h in hits
        ])
        return EXIT_OK
    for h in hits:
        m = h.memory
        tag = f"[{m.tier}]" + (f" superseded by {m.superseded_by}" if m.superseded_by else "")
        ext = f" ({m.external_id})" if m.external_id else ""
        if h.excerpted:
            # A summary shows the members that matched; the whole is one `get` away.
            tag += (f" {m.origin}: {len(h.members)} member(s) that matched "
                    f"(reverie get {m.id}: the whole summary)")
        else:
            # Its day, as the members of a summary show theirs: two hot statements of
            # one fact ("the manager is Dr Okafor", "Dr Okafor retired") are read by
            # which came later.
            tag += f" {day(m.created_at)}"
        body = h.text.replace("\n", "\n       ")
        print(f"{h.score:.3f}  {m.id}{ext} {m.kind} {tag}\n       {body}")
    return EXIT_OK


def _get(
    id_: Annotated[str, typer.Argument(metavar="ID", parser=_name,
                                       help="a Reverie id or your own external id")],
    profile: Annotated[str | None, typer.Option(
        "--profile", parser=_profile_name, metavar="P",
        help="needed when an external id exists in several profiles")] = None,
    json_: Json = False,
) -> int:
    """Show one memory (any tier) or its tombstone, by Reverie id or your own id."""
    from reverie.models.errors import NotFoundError
    from reverie.models.repositories.memories import get
    from reverie.models.tables import Tombstone

    store = _store()
    try:
        with store.reading_all() as s:
            found = get(s, id_, profile)
    except NotFoundError:
        # A profile the store does not hold is the mistake to name, as blocks and recall
        # name it: "no memory" sent the user looking for the memory instead.
        if profile is not None:
            store.resolve_profiles(profile)
        raise
    data = (
        {"tombstone": True, **_in_field_order(found)}
        if isinstance(found, Tombstone)
        else _memory_json(found)
    )
    if json_:
        _print_json(data)
    else:
        # What a person looks for first: which memory, and what it says.
        first = [k for k in ("tombstone", "id", "external_id", "profile_id", "content")
                 if k in data]
        for key in [*first, *(k for k in data if k not in first)]:
            print(f"{key:>18}: {data[key]}")
    return EXIT_OK


def _memory_json(m: Memory | Any) -> dict[str, Any]:
    from reverie.models.tables import Memory

    data = _in_field_order(m) if isinstance(m, Memory) else asdict(m)
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in data.items()}


def _in_field_order(row: Any) -> dict[str, Any]:
    """A row's fields in its table's declared order. ``model_dump`` gives them in the
    order SQLAlchemy filled the row in, which follows where objects happen to lie in
    memory: it changed with what the process had imported before."""
    data = row.model_dump()
    return {**{k: data[k] for k in type(row).model_fields if k in data}, **data}


def _export(
    profile: Profile,
    output: Annotated[Path | None, typer.Option(
        "--output", metavar="FILE", help="file to write (default: standard output)")] = None,
    canonical: Annotated[bool, _flag(
        "--canonical", help="the comparison form: vectors as hashes, no run history")] = False,
    with_run_ids: Annotated[bool, _flag(
        "--with-run-ids", help="--canonical: include Prefect run ids")] = False,
) -> int:
    """Back up a profile: every row of it (tiers, vectors, edges, blocks, audit,
    tombstones, run history) as JSONL (format 2) ending in a record of each table's row
    count and SHA-256, which `reverie ingest` restores exactly into a store without that
    profile. --canonical: the stably ordered comparison form (vectors as hashes)."""
    from reverie.models.backup import backup_lines
    from reverie.models.export import export_jsonl

    store = _store()
    store.resolve_profiles(profile)
    lines: Iterable[str] = (
        [export_jsonl(store.url, profile, with_run_ids)] if canonical
        else backup_lines(store.url, profile))
    if output:
        with output.open("w", encoding="utf-8") as out:
            out.writelines(lines)
    else:
        sys.stdout.writelines(lines)
    return EXIT_OK


# --- bench --------------------------------------------------------------------------------

OffsetDays = Annotated[float, typer.Option(
    "--as-of-offset-days", metavar="N",
    help="consolidate this long after the last memory")]


def _bench_locomo(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="a LoCoMo-format file")],
    as_of_offset_days: OffsetDays = 90.0,
    budget: Annotated[int, typer.Option("--budget", metavar="N", min=CONTEXT_CHARS[0],
                                        max=CONTEXT_CHARS[1], help="context characters")]
    = 2000,
    conversations: Annotated[Names | None, typer.Option(
        "--conversations", parser=_names, metavar="IDS",
        help="only these conversations, by sample id, comma-separated (e.g. one fold's two "
        "tuning conversations, or its third to validate on; default all)")] = None,
    summarizer: Summarizer = SummarizerChoice.AUTO,
    preset_name: Preset = None,
    json_out: JsonOut = None,
) -> int:
    """Does consolidation lose facts? Answers still found after consolidation, on a
    LoCoMo-format file (the README's Quality section)."""
    from reverie.benchmarks.locomo import (
        bench_locomo,
        load_locomo,
        render_locomo,
        select_conversations,
    )

    chosen = list(conversations) if conversations else None
    if not path.is_file():
        raise ReverieError(f"no such file: {path}")
    select_conversations(load_locomo(path), chosen)  # bad input: at once
    from reverie.models.config import ConsolidationConfig, preset

    base = preset(preset_name) if preset_name else ConsolidationConfig()
    config = base.model_copy(update={"summarizer": summarizer.value})
    from reverie.runner.temporary_server import keep_with_this_process

    keep_with_this_process()
    result = bench_locomo(path, as_of_offset_days, budget, config, chosen)
    print(render_locomo(result))
    if json_out:
        json_out.write_text(json.dumps(result.as_json(), indent=2) + "\n", encoding="utf-8")
    return EXIT_OK


def _bench_updates(
    profiles: Annotated[int, typer.Option(
        "--profiles", metavar="N", min=BENCH_PROFILES[0], max=BENCH_PROFILES[1],
        help="profiles, each with one chain per fact kind")] = 8,
    as_of_offset_days: OffsetDays = 90.0,
    summarizer: Summarizer = SummarizerChoice.AUTO,
    preset_name: Preset = None,
    json_out: JsonOut = None,
) -> int:
    """Update chains: does hot recall answer an updated fact with its newest value?"""
    from reverie.benchmarks.updates import bench_updates, render_updates
    from reverie.models.config import ConsolidationConfig, preset
    from reverie.runner.temporary_server import keep_with_this_process

    base = preset(preset_name) if preset_name else ConsolidationConfig()
    config = base.model_copy(update={"summarizer": summarizer.value})
    keep_with_this_process()
    result = bench_updates(profiles, as_of_offset_days, config)
    print(render_updates(result))
    if json_out:
        json_out.write_text(json.dumps(result.as_json(), indent=2) + "\n", encoding="utf-8")
    return EXIT_OK


def _bench_synthetic(
    ctx: typer.Context,
    sizes: Annotated[Numbers, typer.Option(
        "--sizes", parser=_sizes, metavar="SIZES",
        help="memories per store, comma-separated")] = Numbers([1000, 10_000]),  # noqa: B008 - an immutable-in-use default
    profiles: Annotated[int, typer.Option(
        "--profiles", metavar="N", min=BENCH_PROFILES[0], max=BENCH_PROFILES[1],
        help="profiles to spread them over")] = 1,
    duplicate_share: Annotated[float, typer.Option(
        "--duplicate-share", metavar="R", min=0.0, max=1.0,
        help="share of memories in near-duplicate groups")] = 0.10,
    embeddings: Annotated[Embeddings, typer.Option(
        "--embeddings", metavar="random|real",
        help="clustered synthetic vectors or the real model's")]
    = Embeddings.RANDOM,
    ingest_sentences: Annotated[int, typer.Option(
        "--ingest-sentences", metavar="N", min=INGEST_SENTENCES[0], max=INGEST_SENTENCES[1],
        help="sentences for ingest vs raw model throughput (0 skips it)")] = 2048,
    no_flows: Annotated[bool, _flag(
        "--no-flows", help="time the steps only, not the flows through Prefect")] = False,
    no_baseline: Annotated[bool, _flag(
        "--no-baseline", help="skip the exact baseline and recall checks")] = False,
    no_steps: Annotated[bool, _flag(
        "--no-steps", help="skip the per-step rows (flows and their work only)")] = False,
    server: Annotated[bool, _flag(
        "--server", help="run the flows through a real Prefect server started for the bench "
        "(its database: $PREFECT_API_DATABASE_CONNECTION_URL, else SQLite)")] = False,
    flow_list: Annotated[Names | None, typer.Option(
        "--flow-list", parser=_flow_list, metavar="FLOWS",
        help="flows to time, comma-separated (default: all)")] = None,
    database_url: Annotated[str | None, typer.Option(
        "--database-url", metavar="URL",
        help="keep the stores on this PostgreSQL server, one database each, dropped at the "
        "end; its role must be allowed to CREATE DATABASE (default: SQLite files in a "
        "temporary folder)")] = None,
    json_out: Annotated[Path | None, typer.Option(
        "--json", metavar="OUT", help="write the results as JSON")] = None,
    markdown: MarkdownOut = None,
) -> int:
    """How fast is every step and flow, from 1k to 1M memories? Times them on generated
    stores of chosen sizes (BENCHMARKS.md)."""
    # Prefect reads these when it is first imported: keep its console to warnings.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from reverie.benchmarks.speed import (
        FLOW_ORDER,
        as_json,
        backend,
        bench_synthetic,
        render_markdown,
    )
    from reverie.deployments.serve import loopback_server
    from reverie.runner.temporary_server import keep_with_this_process

    size_list, flows = list(sizes), list(flow_list) if flow_list else None
    unknown = sorted(set(flows or ()) - set(FLOW_ORDER))
    if unknown:
        raise ReverieError(f"--flow-list: unknown flow(s) {', '.join(unknown)}; "
                           f"choose from {', '.join(FLOW_ORDER)}")
    if database_url and not database_url.startswith("postgresql"):
        raise ReverieError("--database-url: a PostgreSQL server URL, e.g. "
                           "postgresql+psycopg2://user:password@host:5432/postgres")
    store_backend = backend(database_url)
    if not no_flows and not server:
        keep_with_this_process()
    # The server's URL without its password, as the results name it.
    command_line = _command_line(ctx, {"database_url": str(store_backend["database_server"])}
                                 if database_url else None)
    done: list[Any] = []

    def progress(row: Any) -> None:
        verdict = f"  [{row.verdict}]" if row.verdict else ""
        print(f"{row.task:<34} n={row.n:<9,} {row.seconds:9.3f} s  "
              f"peak {row.peak_rss_mb or 0:7.0f} MB{verdict}", flush=True)
        # Rewritten after every row: a long run interrupted keeps the rows it measured.
        done.append(row)
        if json_out:
            json_out.write_text(
                json.dumps(as_json(done, command_line, store_backend), indent=2) + "\n",
                encoding="utf-8")
        if markdown:
            markdown.write_text(render_markdown(done) + "\n", encoding="utf-8")

    results = bench_synthetic(
        size_list, profiles, duplicate_share, embeddings.value, not no_flows,
        not no_baseline, ingest_sentences, progress,
        server=loopback_server if server else None,
        step_rows=not no_steps, flow_names=flows or FLOW_ORDER,
        database_url=database_url,
    )
    print(render_markdown(results))  # the files already hold every row
    return EXIT_OK


def _bench_api(
    ctx: typer.Context,
    sizes: Annotated[Numbers, typer.Option(
        "--sizes", parser=_sizes, metavar="SIZES",
        help="memories per profile, comma-separated")] = Numbers([1000, 10_000]),  # noqa: B008 - an immutable-in-use default
    clients: Annotated[Numbers, typer.Option(
        "--clients", parser=_clients, metavar="CLIENTS",
        help="concurrent clients, comma-separated")] = Numbers([1, 8, 32]),  # noqa: B008 - an immutable-in-use default
    profiles: Annotated[int, typer.Option(
        "--profiles", metavar="N", min=BENCH_PROFILES[0], max=BENCH_PROFILES[1],
        help="profiles in the store")] = 2,
    requests: Annotated[int, typer.Option(
        "--requests", metavar="N", min=BENCH_CALLS[0], max=BENCH_CALLS[1],
        help="recall calls per row")] = 160,
    store_requests: Annotated[int, typer.Option(
        "--store-requests", metavar="N", min=BENCH_CALLS[0], max=BENCH_CALLS[1],
        help="store calls per row")] = 64,
    store_batch: Annotated[int, typer.Option(
        "--store-batch", metavar="N", min=STORE_BATCH[0], max=STORE_BATCH[1],
        help="sentences per store call")] = 16,
    ingest_sentences: Annotated[int, typer.Option(
        "--ingest-sentences", metavar="N", min=INGEST_SENTENCES[0], max=INGEST_SENTENCES[1],
        help="sentences per run for ingest's in-process throughput, store's yardstick "
        "(0 skips it)")] = 4096,
    ingest_runs: Annotated[int, typer.Option(
        "--ingest-runs", metavar="N", min=INGEST_RUNS[0], max=INGEST_RUNS[1],
        help="runs of ingest and of the raw model each, alternating; the medians")] = 3,
    workers: Annotated[int, typer.Option(
        "--workers", metavar="N", min=API_WORKERS[0], max=API_WORKERS[1],
        help="server processes of `reverie api` (its --workers)")] = 1,
    json_out: Annotated[Path | None, typer.Option(
        "--json", metavar="OUT", help="write the results as JSON")] = None,
    markdown: MarkdownOut = None,
) -> int:
    """How fast do agents recall and store through `reverie api`? Latency and
    throughput from outside, with concurrent clients (BENCHMARKS.md)."""
    from reverie.benchmarks.api import bench_api, render_api

    command_line = _command_line(ctx)
    size_list, client_list = list(sizes), list(clients)

    def progress(row: Any) -> None:
        print(f"{row.operation:<7} n={row.memories_per_profile:<7,} clients={row.clients:<3} "
              f"p50 {row.p50_ms:8.1f} ms  p95 {row.p95_ms:8.1f} ms  "
              f"{row.calls_per_second:7.1f} calls/s  errors {row.errors}", flush=True)

    result = bench_api(size_list, client_list, profiles, requests, store_requests, store_batch,
                       ingest_sentences, command_line, progress, workers, ingest_runs)
    text = render_api(result)
    print(text)
    if json_out:
        json_out.write_text(json.dumps(result.as_json(), indent=2) + "\n", encoding="utf-8")
    if markdown:
        markdown.write_text(text + "\n", encoding="utf-8")
    return EXIT_OK


def _bench_embedding(
    locomo: Annotated[Path | None, typer.Option(
        "--locomo", metavar="FILE", help="a LoCoMo-format file: its turns, summaries of "
        "them, and every sentence compared (default: synthetic sentences only)")] = None,
    sentences: Annotated[int, typer.Option(
        "--sentences", metavar="N", min=EMBEDDING_SENTENCES[0], max=EMBEDDING_SENTENCES[1],
        help="synthetic sentences per workload and for the ingest")] = 2048,
    json_out: Annotated[Path | None, typer.Option(
        "--json", metavar="OUT", help="also write the rows as JSON")] = None,
) -> int:
    """OpenVINO against PyTorch embeddings: speed and closeness, same run."""
    from reverie.benchmarks.embedding import bench_embedding, render_embedding

    if locomo is not None and not locomo.is_file():
        raise ReverieError(f"no such file: {locomo}")
    rows = bench_embedding(locomo, sentences)
    print(render_embedding(rows))
    if json_out:
        json_out.write_text(json.dumps([r.as_json() for r in rows], indent=2) + "\n",
                            encoding="utf-8")
    return EXIT_OK


# --- servers ------------------------------------------------------------------------------


def _serve(
    port: Annotated[int, typer.Option("--port", metavar="N", min=1, max=65535,
                                      help="the Prefect server's port")] = 4200,
    home: Annotated[Path | None, typer.Option(
        "--home", metavar="PATH", help="Prefect's own folder (default .reverie/prefect)")]
    = None,
) -> int:
    """The local Prefect stack (`make server`): a Prefect server, every flow deployed
    and a worker (Prefect's database: $PREFECT_API_DATABASE_CONNECTION_URL, else
    SQLite)."""
    from reverie.deployments.serve import serve

    return serve(port, home)


Host = Annotated[str, typer.Option("--host", metavar="HOST", help="address to listen on "
                                   "(127.0.0.1: this machine only)")]
Port = Annotated[int, typer.Option("--port", metavar="N", min=1, max=65535, help="port")]


def _api(
    host: Host = "127.0.0.1",
    port: Port = 8765,
    workers: Annotated[int | None, typer.Option(
        "--workers", metavar="N", min=API_WORKERS[0], max=API_WORKERS[1],
        help="server processes on the port (default REVERIE_API_WORKERS, 1)")] = None,
) -> int:
    """Serve the agent HTTP API (JSON endpoints, OpenAPI at /openapi.json, MCP at /mcp);
    tokens: REVERIE_API_TOKENS, REVERIE_API_ADMIN_TOKEN or REVERIE_API_TOKENS_BLOCK."""
    from reverie.deployments.auth import load_tokens
    from reverie.deployments.http_api import serve
    from reverie.models.settings import get_settings

    _store()  # a store that is not there: said now, not on each agent's call
    settings = get_settings()
    tokens = load_tokens(settings)  # refused now if missing, not in each worker
    count = settings.api_workers if workers is None else workers
    print(f"reverie api on http://{host}:{port} (OpenAPI: /docs, MCP: /mcp"
          f"{f', {count} processes' if count > 1 else ''})", file=sys.stderr, flush=True)
    serve(tokens, host, port, count)
    return EXIT_OK


def _mcp(
    transport: Annotated[Transport, typer.Option(
        "--transport", metavar="stdio|http",
        help="stdio for a local agent, http for a platform")]
    = Transport.STDIO,
    host: Host = "127.0.0.1",
    port: Port = 8765,
    workers: Annotated[int | None, typer.Option(
        "--workers", metavar="N", min=API_WORKERS[0], max=API_WORKERS[1],
        help="over http: server processes on the port (default REVERIE_MCP_WORKERS, 1)")]
    = None,
) -> int:
    """Serve Reverie's tools over MCP: stdio for a local agent (token: REVERIE_MCP_TOKEN),
    or streamable HTTP at /mcp."""
    from reverie.deployments.auth import load_tokens
    from reverie.models.settings import get_settings

    if transport is Transport.STDIO and workers not in (None, 1):
        # One agent spawns one stdio server: there is no port to share.
        raise ReverieError("--workers: only with --transport http")
    _store()  # a store that is not there: said now, not on each agent's call
    settings = get_settings()
    tokens = load_tokens(settings)
    if transport is Transport.HTTP:
        from reverie.deployments.http_api import serve

        count = settings.mcp_workers if workers is None else workers
        print(f"reverie mcp on http://{host}:{port}/mcp"
              f"{f' ({count} processes)' if count > 1 else ''}", file=sys.stderr, flush=True)
        serve(tokens, host, port, count)
        return EXIT_OK
    from reverie.deployments.auth import UnauthorizedError
    from reverie.deployments.mcp_server import run_stdio
    from reverie.models.errors import ConfigError

    # Over stdio the token is the process's own: a missing or wrong one is said once, at
    # start (the agent's client shows it), not as a 401 on every call.
    token = settings.mcp_token
    try:
        tokens.authenticate(token.get_secret_value() if token else None)
    except UnauthorizedError:
        raise ConfigError(
            "REVERIE_MCP_TOKEN: " + ("not one of the configured tokens" if token else "not set")
            + "; set it, in the MCP client's configuration of the server, to a token of "
            "REVERIE_API_TOKENS or REVERIE_API_ADMIN_TOKEN") from None
    run_stdio(tokens)
    return EXIT_OK


def _demo(database: Annotated[Path | None, typer.Option(
        "--database", metavar="FILE", help="SQLite file for the demo store")] = None) -> int:
    """Ingest the bundled sample store and consolidate it."""
    from reverie.demo.run import run_demo
    from reverie.deployments.local_server import local_api

    return run_demo(database, local_api)


# Every top-level command, in the order `reverie --help` lists them (typer's: the
# commands, then the groups): how to register it on an app (made into its click command
# only when looked up, ``_Commands``).
_COMMANDS: dict[str, Callable[[typer.Typer], None]] = {
    "ingest": _one("ingest", _ingest),
    "init": _one("init", _init),
    "approve": _one("approve", _approve),
    "backfill": _one("backfill", _backfill, _one_of("profile", "all_", required=True)),
    "server": _one("server", _server),
    "status": _one("status", _status),
    "session-end": _one("session-end", _session_end),
    "undo": _one("undo", _undo),
    "consolidations": _one("consolidations", _consolidations,
                           _one_of("limit", "all_", required=False)),
    "blocks": _one("blocks", _blocks),
    "recall": _one("recall", _recall),
    "get": _one("get", _get),
    "export": _one("export", _export),
    "alerts": _one("alerts", _alerts),
    "crash-detection": _one("crash-detection", _crash_detection),
    "serve": _one("serve", _serve),
    "api": _one("api", _api),
    "mcp": _one("mcp", _mcp),
    "demo": _one("demo", _demo),
    "consolidate": _many("consolidate", _consolidate_app),
    "run": _many("run", _run_app),
    "events": _many("events", _events_app),
    "bench": _many("bench", _bench_app),
}


def console() -> NoReturn:
    """The ``reverie`` executable: ``main``, with the youngest generation collected less
    often (``executable.YOUNG_COLLECTION_EVERY``), then exit without the interpreter's last
    garbage collection over Prefect's ~200,000 objects (half a second of a local
    command). ``gc.freeze`` moves them out of the collector's reach; everything else at
    exit (flushing Prefect's logs and events, closing files) happens as before."""
    from reverie.deployments.executable import collect_less_often

    collect_less_often()  # already, when run as `reverie`; `python -m` comes here first
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`reverie consolidations | head`): stop quietly, and keep
        # the interpreter from failing again as it flushes stdout on the way out.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_REJECTED
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    console()
