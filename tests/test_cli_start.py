"""The `reverie` command's start-up (issue #39 item 3): only the command named on the line
is made, the tree help shows is the one an eager build makes, the option bounds and
choices, and the start-up bench's arithmetic."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, get_args

import pytest
import typer
from typer._click.core import Command, Context
from typer.core import TyperGroup

from reverie.benchmarks.cli_start import MOVED, Sample, old_module, summarize
from reverie.deployments.cli import (
    _COMMANDS,
    API_WORKERS,
    BENCH_CALLS,
    BENCH_CLIENTS,
    BENCH_PROFILES,
    BENCH_SIZES,
    CONTEXT_CHARS,
    EMBEDDING_SENTENCES,
    EXIT_ERROR,
    FLUSH_SECONDS,
    HISTORY_SHOWN,
    INGEST_RUNS,
    INGEST_SENTENCES,
    RECALL_K,
    SHORT,
    STORE_BATCH,
    SummarizerChoice,
    _Commands,
    _typer,
    fresh_command,
    main,
)
from reverie.deployments.executable import unswept
from reverie.models.config import SummarizerName
from reverie.models.store import Store


def _eager() -> TyperGroup:
    """Every command registered on one app and made at once, as typer makes an app."""
    app = _typer()
    app.callback(help="Memory consolidation for AI agents.")(lambda: None)
    for register in _COMMANDS.values():
        register(app)
    return typer.main.get_group(app)


def _shape(command: Command) -> Any:
    sub = (command.commands if isinstance(command, TyperGroup) else {})
    return (type(command).__name__, command.help, command.hidden,
            [(p.name, p.opts, p.required, p.default, p.metavar, str(getattr(p, "type", "")),
              getattr(p, "help", None))
             for p in command.params if p.name != "help"],
            getattr(command, "one_of", None), getattr(command, "one_required", None),
            {name: _shape(c) for name, c in sub.items()}, list(sub))


def test_the_lazy_tree_is_the_eager_tree_command_for_command() -> None:
    lazy, eager = fresh_command(), _eager()
    # typer lists the commands, then the groups, each in the order they were added.
    assert list(lazy.commands) == list(eager.commands)
    for name in eager.commands:
        assert _shape(lazy.commands[name]) == _shape(eager.commands[name]), name


def test_a_line_makes_only_the_command_it_names() -> None:
    root = fresh_command()
    commands = root.commands
    assert isinstance(commands, _Commands)
    ctx = root.make_context("reverie", ["status", "--limit", "3"])
    name, command, rest = root.resolve_command(ctx, ["status", "--limit", "3"])
    assert name == "status" and command is not None and rest == ["--limit", "3"]
    assert list(commands._made) == ["status"]


def test_the_command_module_leaves_the_store_and_prefect_unimported() -> None:
    # `reverie --help` and the tree cost neither SQLAlchemy, pydantic nor Prefect.
    code = ("import sys; from reverie.deployments.cli import command; command(); "
            "print(sorted(m for m in ('sqlalchemy', 'sqlmodel', 'pydantic', 'prefect', "
            "'reverie.models.store') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]"


# A short command's own path imports only what its reads need: numpy (84 modules, about
# a seventh of `get`'s start) only where vectors are decoded or checked, and the
# consolidation knobs (models.config, which the argparse CLI imported at its top) only
# where a config is asked for.
READS_WITHOUT_NUMPY = (
    ("get", "maya-001"),
    ("export", "--profile", "maya"),
    ("export", "--profile", "maya", "--canonical"),
    ("consolidations", "--profile", "maya"),
    ("status",),
)


def test_short_reads_run_without_importing_numpy_or_the_knobs(sample_store: Store) -> None:
    code = ("import atexit, sys; atexit.register(lambda: print([m for m in ('numpy', "
            "'reverie.models.config') if m in sys.modules], file=sys.stderr)); "
            "from reverie.deployments.executable import console; console()")
    env = {**os.environ, "REVERIE_DATABASE_URL": sample_store.url}
    for words in READS_WITHOUT_NUMPY:
        done = subprocess.run([sys.executable, "-c", code, *words], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout, (words, done.stderr[-2000:])
        assert done.stderr.splitlines()[-1] == "[]", words


def test_reading_the_blocks_imports_no_prefect(sample_store: Store) -> None:
    """An agent trial timed `reverie blocks` at 3 to 4.5 s: the rules it prints came
    with the compile step's module, and Prefect with it (1.3 s)."""
    code = ("import atexit, sys; atexit.register(lambda: print('prefect' in sys.modules, "
            "file=sys.stderr)); from reverie.deployments.executable import console; console()")
    env = {**os.environ, "REVERIE_DATABASE_URL": sample_store.url}
    done = subprocess.run([sys.executable, "-c", code, "blocks", "--profile", "maya"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "maya" in done.stdout, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == "False"


def _parsed(argv: list[str]) -> dict[str, Any]:
    """The values a line gives its command, parsed as `reverie` would, run never."""
    root = fresh_command()
    ctx: Context = root.make_context("reverie", list(argv))
    name, command, rest = root.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
    assert command is not None and name is not None
    while isinstance(command, TyperGroup):
        ctx = command.make_context(name, rest, parent=ctx)
        name, command, rest = command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        assert command is not None and name is not None
    return command.make_context(name, rest, parent=ctx).params


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == EXIT_ERROR
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(("words", "bounds"), [
    (["status", "--limit"], HISTORY_SHOWN),
    (["recall", "q", "--profile", "p", "-k"], RECALL_K),
    (["bench", "locomo", "f.json", "--budget"], CONTEXT_CHARS),
    (["api", "--workers"], API_WORKERS),
    (["mcp", "--transport", "http", "--workers"], API_WORKERS),
    (["bench", "api", "--workers"], API_WORKERS),
    (["bench", "api", "--ingest-runs"], INGEST_RUNS),
    (["bench", "updates", "--profiles"], BENCH_PROFILES),
    (["bench", "synthetic", "--profiles"], BENCH_PROFILES),
    (["bench", "synthetic", "--ingest-sentences"], INGEST_SENTENCES),
    (["bench", "api", "--profiles"], BENCH_PROFILES),
    (["bench", "api", "--requests"], BENCH_CALLS),
    (["bench", "api", "--store-requests"], BENCH_CALLS),
    (["bench", "api", "--store-batch"], STORE_BATCH),
    (["bench", "api", "--ingest-sentences"], INGEST_SENTENCES),
    (["bench", "embedding", "--sentences"], EMBEDDING_SENTENCES),
    (["events", "flush", "--timeout"], FLUSH_SECONDS),
])
def test_number_options_take_their_bounds_and_refuse_one_past(
    words: list[str], bounds: tuple[float, float], capsys: pytest.CaptureFixture[str]
) -> None:
    low, high = bounds
    name = words[-1].lstrip("-").replace("-", "_")
    assert _parsed([*words, str(low)])[name] == low
    assert _parsed([*words, str(high)])[name] == high
    option = words[-1]
    def shown(bound: float) -> str:  # as pydantic words it: 0, not 0.0
        return f"{bound:g}" if isinstance(bound, float) else str(bound)

    for outside, says in ((low - 1, f"greater than or equal to {shown(low)}"),
                          (high + 1, f"less than or equal to {shown(high)}")):
        err = _refused([*words, str(outside)], capsys)
        assert f"Invalid value for '{option}'" in err and says in err, err
        assert err.endswith("(--help for usage)")


@pytest.mark.parametrize("setting", ["api_workers", "mcp_workers"])
def test_workers_take_the_settings_range(setting: str) -> None:
    from annotated_types import Ge, Le

    from reverie.models.settings import Settings

    metadata = Settings.model_fields[setting].metadata
    bounds = (next(m.ge for m in metadata if isinstance(m, Ge)),
              next(m.le for m in metadata if isinstance(m, Le)))
    assert bounds == API_WORKERS


def test_mcp_over_stdio_refuses_workers(capsys: pytest.CaptureFixture[str]) -> None:
    # Checked before the store is looked for: no store is needed to be told.
    assert main(["mcp", "--workers", "2"]) == EXIT_ERROR
    assert "--workers: only with --transport http" in capsys.readouterr().err


@pytest.mark.parametrize(("option", "bounds"), [
    ("--sizes", BENCH_SIZES), ("--clients", BENCH_CLIENTS)])
def test_lists_of_whole_numbers_take_their_bounds_and_refuse_one_past(
    option: str, bounds: tuple[int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    low, high = bounds
    name = option.lstrip("-")
    assert _parsed(["bench", "api", option, f"{low},{high}"])[name] == [low, high]
    for given, says in ((f"{low - 1},{high}", f"at least {low}"),
                        (f"{low},{high + 1}", f"at most {high}")):
        err = _refused(["bench", "api", option, given], capsys)
        assert f"Invalid value for '{option}'" in err and says in err, err
    assert _parsed(["bench", "synthetic", "--sizes", str(high)])["sizes"] == [high]


def test_the_summarizer_is_a_closed_choice_of_the_configs_values(
    capsys: pytest.CaptureFixture[str]
) -> None:
    assert sorted(SummarizerChoice) == sorted(get_args(SummarizerName))
    for choice in SummarizerChoice:
        given = _parsed(["bench", "updates", "--summarizer", choice.value])["summarizer"]
        assert given is choice
    assert _parsed(["bench", "updates"])["summarizer"] is SummarizerChoice.AUTO
    err = _refused(["bench", "updates", "--summarizer", "gpt"], capsys)
    assert "'gpt' is not one of 'rules', 'llm', 'auto'" in err, err


# --- the start-up bench's arithmetic -------------------------------------------------------


def test_the_bench_judges_the_median_of_pairwise_ratios() -> None:
    pairs = [(Sample(0.9, 1.0), Sample(1.0, 1.0)), (Sample(1.2, 1.1), Sample(1.0, 1.0)),
             (Sample(0.95, 0.9), Sample(1.0, 1.0))]
    row = summarize("status", pairs, True)
    assert (row.cpu_ratio, row.cpu_ratio_min, row.cpu_ratio_max) == (0.95, 0.9, 1.2)
    assert (row.wall_ratio, row.wall_ratio_min, row.wall_ratio_max) == (1.0, 0.9, 1.1)
    assert row.verdict == "met" and row.pairs == 3
    slower = summarize("get", [(Sample(1.01, 1.0), Sample(1.0, 1.0))], True)
    assert slower.verdict == "missed: 1.010x"


def test_the_baseline_module_points_at_moved_modules_only_in_imports() -> None:
    text = "from reverie.engines.recall import recall\n# reverie.engines.recall stays\n"
    assert old_module(text) == ("from reverie.recall.search import recall\n"
                                "# reverie.engines.recall stays\n")
    for new in MOVED.values():
        __import__(new)


# --- whether a Prefect API is configured, without importing Prefect when none can be ------

_ASK = ("import sys; from reverie.runner.event_delivery import api_url; "
        "mine = api_url(); imported = 'prefect' in sys.modules; "
        "from prefect.settings import get_current_settings; "
        "print(repr(mine), imported, repr(get_current_settings().api.url))")
URL = "http://127.0.0.1:9/api"


# One process each (Prefect reads its settings once): the sources that can name a URL,
# and the two ways none does.
@pytest.mark.slow(seconds=20)
@pytest.mark.parametrize(("where", "text", "env"), [
    (None, "", {}),
    ("pyproject.toml", '[project]\nname = "x"\n', {}),
    (None, "", {"PREFECT_API_URL": URL}),
    (".env", f"PREFECT_API_URL={URL}\n", {}),
    ("prefect.toml", f'[api]\nurl = "{URL}"\n', {}),
    ("mine.toml", f'active = "p"\n[profiles.p]\nPREFECT_API_URL = "{URL}"\n',
     {"PREFECT_PROFILES_PATH": "mine.toml"}),
])
def test_the_api_url_is_prefects_own_and_prefect_is_imported_only_when_a_source_can_set_it(
    tmp_path: Path, where: str | None, text: str, env: dict[str, str]
) -> None:
    (tmp_path / "home").mkdir()
    if where:
        (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / where).write_text(text, encoding="utf-8")
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("PREFECT_")}
    paths = {k: str(tmp_path / v) if k != "PREFECT_API_URL" else v for k, v in env.items()}
    done = subprocess.run([sys.executable, "-c", _ASK], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=True,
                          env={**clean, "HOME": str(tmp_path / "home"), **paths})
    mine, imported, prefects = done.stdout.split()
    assert mine == prefects  # the same answer as Prefect's settings give
    expected = "None" if text in ("", '[project]\nname = "x"\n') and not env else repr(URL)
    assert mine == expected
    assert imported == str(mine != "None")


def test_a_url_set_in_prefects_settings_context_is_seen(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # No file nor variable names one; a test harness or serve's temporary_settings does.
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from reverie.runner.event_delivery import api_url

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in [n for n in os.environ if n.upper().startswith("PREFECT_")]:
        monkeypatch.delenv(name)
    with temporary_settings({PREFECT_API_URL: URL}):
        assert api_url() == URL


def test_the_executable_sets_the_collectors_pace_before_importing_the_cli() -> None:
    code = ("import gc, sys; from reverie.deployments import executable as e; "
            "print('typer' in sys.modules, 'reverie.deployments.cli' in sys.modules); "
            "sys.argv[1:] = ['--version']; e.console()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    first, version = done.stdout.splitlines()
    assert first == "False False" and version.startswith("reverie ")


def test_a_short_command_runs_without_the_collector_and_gives_it_back() -> None:
    seen: list[bool] = []

    def command(value: int) -> int:
        seen.append(gc.isenabled())
        if value < 0:
            raise ValueError(value)
        return value

    assert gc.isenabled()
    assert unswept(command)(3) == 3 and seen == [False] and gc.isenabled()
    with pytest.raises(ValueError):
        unswept(command)(-1)
    assert seen == [False, False] and gc.isenabled()
    gc.disable()  # off already: its owner's to turn back on
    try:
        unswept(command)(1)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_only_commands_whose_run_is_their_start_go_without_the_collector() -> None:
    assert SHORT <= set(_COMMANDS)
    # Whatever runs a flow, serves, benches, ingests or waits keeps the collector.
    assert not SHORT & {"ingest", "backfill", "serve", "api", "mcp", "demo", "consolidate",
                        "run", "bench", "events", "session-end", "approve", "alerts"}


def test_a_short_command_is_run_without_the_collector_and_a_long_one_with_it(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    import reverie.deployments.cli as cli

    seen: dict[str, bool] = {}

    def probe(name: str) -> Any:
        def command(json_: Annotated[bool, typer.Option("--json")] = False) -> int:
            seen[name] = gc.isenabled()
            return 0
        return command

    for name in ("get", "serve"):
        monkeypatch.setitem(cli._COMMANDS, name, cli._one(name, probe(name)))
    monkeypatch.setattr(cli, "command", fresh_command)  # a tree of the probes, not cached
    for name in ("get", "serve"):
        assert main([name]) == 0
    assert seen == {"get": False, "serve": True} and gc.isenabled()
