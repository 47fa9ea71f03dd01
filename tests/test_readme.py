"""The README (and the guides in docs/ it links) is executed: its Python snippets run as
written, its quick start is the Makefile's, and every command, option, make target,
deployment, setting, config knob, file and Python name it quotes exists. A claim that
drifts from the code fails here.

How the README's text is read:

- A fenced ```python block runs as written, in a folder of its own, against a fresh
  store that REVERIE_DATABASE_URL names (the one variable a user sets for it; the
  suite's own, from conftest.py, apply as to every test).
- A fenced ```sh block is a series of command lines: a ``reverie`` line must parse with
  the real parser exactly as written (required arguments included); a ``prefect`` line
  must parse with Prefect's own command line; ``make X`` must name a Makefile target.
- An inline `reverie ...` span names a command and its options; it may be a synopsis:
  ``[optional]``, ``(a | b)`` alternatives, ``a|b`` word choices, ``...`` for "and the
  rest". Every reading of it (each alternative at least once, optional parts with and
  without) must parse, with required arguments excused, since prose names a command
  without spelling all of it out.
- A placeholder is a word in capitals (``FILE``, ``P``, ``ISO``) or text in angle
  brackets (``<run id>``); it stands for one argument, replaced by a value of its type
  from ``PLACEHOLDERS`` (a new one must be added there).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import inspect
import io
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import typer
import yaml
from typer._click.core import Command
from typer._click.exceptions import UsageError
from typer.core import TyperGroup

from reverie.deployments.cli import _OneOf, fresh_command
from reverie.models.config import PRESETS, ConsolidationConfig
from reverie.models.settings import Settings
from reverie.models.store import Store

pytestmark = pytest.mark.store_independent(
    "the README's claims and snippet, on the default store as a newcomer runs it")

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The guides the README links for what is too long for it are held to the same checks,
# read as if they followed it. The benchmarks' history is a record of past rounds, its
# commands as they were then, so it is not.
GUIDES = tuple(sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "benchmarks-history.md"))

# A value for each placeholder, valid for the argument it stands for (dates must parse
# as ISO-8601, numbers as numbers, names as profile names).
PLACEHOLDERS = {
    "FILE": "memories.jsonl", "PATH": "locomo.json", "OUT": "out.json",
    "P": "alice", "S": "s1", "ID": "a1", "IDS": "conv-26,conv-30", "RUN_ID": "0b0e6d5e", "QUERY": "tea",
    # N: within every whole-number option's bounds (bench embedding --sentences: 16 up).
    "ISO": "2025-07-01", "DATE": "2025-07-01", "N": "16", "R": "0.5",
    "NAME": "default", "TEXT": "why", "SIZES": "1000,10000", "CLIENTS": "1,8", "SECONDS": "30",
    "URL": "postgresql+psycopg2://reverie:reverie@127.0.0.1:5432/postgres", "HOST": "127.0.0.1", "FLOW": "decay", "FLOWS": "decay,full", "TYPE/NAME": "slack-webhook/ops",
    "<>": "a1",
}

# Names the README quotes that are not Reverie's, so nothing here can define them.
OUTSIDE_NAMES = {
    # AutoMem's setting, quoted where Reverie departs from AutoMem on purpose.
    "CONSOLIDATION_DECAY_IMPORTANCE_THRESHOLD",
    # An example value of REVERIE_ALERT_BLOCK: a Prefect block type's slug and a block
    # name the user makes; it only looks like a flow/deployment name.
    "slack-webhook/ops",
    # The thread counts of the numeric libraries, which tests/conftest.py sets to one: the
    # libraries read them, Reverie does not.
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
}
# Programs other than reverie, prefect and make that the README tells a user to run.
# Their own command lines are not loaded here; what they are given of Reverie's (the
# Alembic config's path) is checked as a path.
OUTSIDE_COMMANDS = {
    "createdb",  # PostgreSQL's client, making Prefect's database
    "dask",  # Dask's scheduler and worker (distributed, pinned in pyproject.toml)
    "pip",  # installing the checkout on a worker
    "alembic",  # the store's migrations by hand
}

# File endings that make a quoted word a path in the repository.
PATH_ENDINGS = (".py", ".ini", ".jsonl", ".json", ".toml", ".yaml", ".yml", ".md", ".mako")


@dataclass(frozen=True)
class Block:
    info: str
    line: int
    text: str


@dataclass(frozen=True)
class Span:
    line: int
    text: str

    def __str__(self) -> str:
        return f"{_where(self.line)}: `{self.text}`"


# --- reading the README -------------------------------------------------------------------


@cache
def _texts() -> tuple[tuple[str, str], ...]:
    return tuple((p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8"))
                 for p in (README, *GUIDES))


@cache
def _readme() -> str:
    """The README, then each guide, one text: line numbers run on through them."""
    return "".join(text if text.endswith("\n") else text + "\n" for _, text in _texts())


def _where(line: int) -> str:
    """A line of ``_readme()`` as the file and line it is in."""
    for name, text in _texts():
        count = text.count("\n") + (0 if text.endswith("\n") else 1)
        if line <= count:
            return f"{name}:{line}"
        line -= count
    return f"README.md:{line}"


@cache
def blocks() -> tuple[Block, ...]:
    found, lines = [], _readme().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            info, start, i = lines[i][3:].strip(), i + 1, i + 1
            while not lines[i].startswith("```"):
                i += 1
            found.append(Block(info, start + 1, "\n".join(lines[start:i]) + "\n"))
        i += 1
    return tuple(found)


@cache
def spans() -> tuple[Span, ...]:
    """Inline code spans, outside fenced blocks. A span may run over a line break (Markdown
    reads it as a space), never over a blank line."""
    text = _readme()
    # Blank out fenced blocks, keeping their line breaks so line numbers stay right.
    text = re.sub(r"^```.*?^```", lambda m: re.sub(r"[^\n]", " ", m.group()), text,
                  flags=re.S | re.M)
    found = []
    for m in re.finditer(r"`([^`]+)`", text):
        assert "\n\n" not in m.group(1), f"{_where(_line(m.start()))}: unclosed `"
        # Inside a table, \| is a | of the span.
        body = " ".join(m.group(1).replace("\\|", "|").split())
        found.append(Span(_line(m.start()), body))
    return tuple(found)


def _line(offset: int) -> int:
    return _readme().count("\n", 0, offset) + 1


def shell_lines() -> Iterator[tuple[int, list[str]]]:
    for block in blocks():
        if block.info not in ("sh", "bash", "shell", "console"):
            continue
        for n, line in enumerate(block.text.splitlines()):
            words = shlex.split(line, comments=True)
            if words:
                yield block.line + n, words


def _spans_starting(*commands: str) -> list[Span]:
    return [s for s in spans() if s.text.split(" ", 1)[0] in commands and " " in s.text]


# --- the code's side ----------------------------------------------------------------------


@cache
def _reverie_command(relaxed: bool) -> TyperGroup:
    """The `reverie` command's tree (a fresh one: relaxed changes it); relaxed, nothing is
    required (prose names a command and some of its options)."""
    root = fresh_command()
    if relaxed:
        for command in _all_commands(root):
            for param in command.params:
                param.required = False
            if isinstance(command, _OneOf):
                command.one_required = False
            command.no_args_is_help = False  # `reverie -v ...` names no command
    return root


def _all_commands(command: Command) -> Iterator[Command]:
    yield command
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            yield from _all_commands(sub)


def _parse(root: TyperGroup, argv: list[str]) -> None:
    """Parse ``argv`` down to the command it names, as `reverie` would, running none."""
    ctx = root.make_context("reverie", list(argv))
    while isinstance(ctx.command, TyperGroup):
        args = [*ctx._protected_args, *ctx.args]
        if not args:
            return  # a group run alone (`reverie events`), or --help
        name, command, rest = ctx.command.resolve_command(ctx, args)
        assert command is not None and name is not None
        ctx = command.make_context(name, rest, parent=ctx)


def parse_reverie(argv: list[str], relaxed: bool) -> str | None:
    """None if ``argv`` parses, else the command's complaint."""
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            _parse(_reverie_command(relaxed), argv)
    except UsageError as exc:
        return exc.format_message()
    except typer.Exit:  # --help, --version
        return None
    return None


@cache
def makefile() -> dict[str, list[str]]:
    """Each target of the Makefile and its recipe lines, from make's own database (so
    variables, pattern rules and includes are make's business, not a regex's)."""
    done = subprocess.run(["make", "-pRrq", "-f", "Makefile", ":"], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    targets: dict[str, list[str]] = {}
    lines = done.stdout.splitlines()
    current: str | None = None
    for previous, line in zip(["", *lines], lines, strict=False):
        rule = re.match(r"^([^\s#:=][^:=]*?):(?!=)", line)
        if rule and previous != "# Not a target:":
            current = rule.group(1)
            targets.setdefault(current, [])
        elif line.startswith("\t") and current is not None:
            recipe = targets[current]
            # A line ending in a backslash goes on: one shell command, as make runs it.
            if recipe and recipe[-1].endswith("\\"):
                recipe[-1] = recipe[-1][:-1] + line.strip()
            else:
                recipe.append(line.strip())
        elif not line.strip():
            current = None
    return targets


@cache
def deployments() -> dict[str, list[str]]:
    """``flow/deployment`` of each deployment in prefect.yaml, with its flow's parameters:
    the flow's name read from its entrypoint's source (importing every flow costs Prefect
    seconds)."""
    found = {}
    for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]:
        path, function = d["entrypoint"].split(":")
        module = ast.parse((ROOT / path).read_text())
        constants = {t.id: n.value.value for n in module.body if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant) for t in n.targets
                     if isinstance(t, ast.Name)}
        fn = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == function)
        decorator = next(d for d in fn.decorator_list if isinstance(d, ast.Call))
        name = ([k.value for k in decorator.keywords if k.arg == "name"] or decorator.args)[0]
        flow = name.value if isinstance(name, ast.Constant) else constants[name.id]
        params = [a.arg for a in fn.args.args + fn.args.kwonlyargs]
        found[f"{flow}/{d['name']}"] = params
    return found


def work_pool() -> str:
    pools = yaml.safe_load((ROOT / "prefect.yaml").read_text())["definitions"]["work_pools"]
    (pool,) = pools.values()
    return pool["name"]


@dataclass
class CodeIndex:
    """What the package's code names: identifiers and its string literals (docstrings and
    comments left out, so a name that only a comment still mentions does not count)."""

    names: set[str]
    strings: set[str]
    functions: set[str]
    classes: dict[str, str]  # class name -> module


@cache
def repo_files() -> tuple[Path, ...]:
    """The checkout's files, without what installing and running it made."""
    made = ("build", "__pycache__")
    return tuple(p for top in sorted(ROOT.iterdir())
                 if not top.name.startswith(".") and top.name not in made
                 and not top.name.endswith(".egg-info")
                 for p in ([top] if top.is_file() else top.rglob("*"))
                 if p.is_file() and not set(made) & set(p.parts))


def _python_files(tests: bool) -> Iterator[Path]:
    for path in repo_files():
        if path.suffix == ".py" and (path.relative_to(ROOT).parts[0] == "tests") == tests:
            yield path


@cache
def code(tests: bool = False) -> CodeIndex:
    index = CodeIndex(set(), set(), set(), {})
    for path in _python_files(tests):
        relative = path.relative_to(ROOT)
        module = "reverie." + ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)
                      and isinstance(n.value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                index.names.add(node.id)
            elif isinstance(node, ast.Attribute):
                index.names.add(node.attr)
            elif isinstance(node, ast.arg | ast.keyword) and node.arg:
                index.names.add(node.arg)
            elif isinstance(node, ast.alias):
                index.names.update(node.name.split("."))
            elif isinstance(node, ast.ImportFrom) and node.module:
                index.names.update(node.module.split("."))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                index.names.add(node.name)
                index.functions.add(node.name)
            elif isinstance(node, ast.ClassDef):
                index.names.add(node.name)
                index.classes.setdefault(node.name, module)
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in docstrings):
                index.strings.add(node.value)
    if not tests:
        # prefect.yaml's keys and values are code too (deployments' parameters, triggers).
        def walk(value: object) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    index.names.add(str(k))
                    walk(v)
            elif isinstance(value, list):
                for v in value:
                    walk(v)
            elif isinstance(value, str):
                index.strings.add(value)
        walk(yaml.safe_load((ROOT / "prefect.yaml").read_text()))
    return index


def in_code(name: str) -> bool:
    return name in code().names or name in code().strings


# --- synopses -----------------------------------------------------------------------------


def readings(text: str) -> list[list[str]]:
    """The command lines a synopsis stands for: each alternative at least once, optional
    parts all given, and once none; placeholders replaced by values."""
    text = re.sub(r"<[^>]*>", " <> ", text)
    tokens = re.sub(r"([\[\]()])", r" \1 ", text).split()
    tree, end = _synopsis(tokens, 0, None)
    assert end == len(tokens), f"unbalanced brackets in `{text}`"
    width = _width(tree)
    lines = [_reading(tree, k, True) for k in range(width)] + [_reading(tree, 0, False)]
    return [[_value(t) for t in line] for line in lines]


def _synopsis(tokens: list[str], i: int, close: str | None) -> tuple[tuple, int]:
    alternatives: list[list[tuple]] = []
    sequence: list[tuple] = []
    while i < len(tokens):
        t = tokens[i]
        if t in ("[", "("):
            inner, i = _synopsis(tokens, i + 1, "]" if t == "[" else ")")
            sequence.append(("optional" if t == "[" else "group", inner))
            continue
        i += 1
        if t == close:
            return ("either", [*alternatives, sequence]), i
        if t == "|":  # spaced: between whole sequences
            alternatives.append(sequence)
            sequence = []
        elif t != "...":  # "and so on": what it stands for is not spelled out
            sequence.append(("word", t.split("|")))  # unspaced: between words
    assert close is None, f"unclosed {close!r} in {' '.join(tokens)}"
    return ("either", [*alternatives, sequence]), i


def _width(node: tuple) -> int:
    kind, inner = node
    if kind == "word":
        return len(inner)
    if kind == "either":
        return max([len(inner)] + [_width(n) for seq in inner for n in seq])
    return _width(inner)


def _reading(node: tuple, k: int, full: bool) -> list[str]:
    kind, inner = node
    if kind == "word":
        return [inner[min(k, len(inner) - 1)]]
    if kind == "either":
        return [w for n in inner[min(k, len(inner) - 1)] for w in _reading(n, k, full)]
    if kind == "optional" and not full:
        return []
    return _reading(inner, k, full)


def _value(token: str) -> str:
    if token == "<>" or re.fullmatch(r"[A-Z][A-Z_/]*", token):
        assert token in PLACEHOLDERS, f"placeholder {token!r}: add a value to PLACEHOLDERS"
        return PLACEHOLDERS[token]
    return token


def _program(word: str) -> str:
    """`.venv/bin/reverie` is `reverie`, as the Makefile's `$(BIN)/reverie` is."""
    return word.rsplit("/", 1)[-1]


# --- commands -----------------------------------------------------------------------------


def test_every_reverie_command_line_of_a_shell_block_parses_as_written() -> None:
    bad, seen = [], 0
    for line, words in shell_lines():
        if _program(words[0]) == "reverie":
            seen += 1
            if (error := parse_reverie([_value(w) for w in words[1:]], relaxed=False)):
                bad.append(f"{_where(line)}: {shlex.join(words)}\n    {error}")
    assert seen, "the README's shell blocks name no reverie command: is the extractor broken?"
    assert not bad, "\n".join(bad)


def test_every_reverie_command_the_text_names_parses() -> None:
    bad, named = [], _spans_starting("reverie", ".venv/bin/reverie")
    assert len(named) > 20, "the README quotes few reverie commands: is the extractor broken?"
    for span in named:
        for argv in readings(span.text):
            if (error := parse_reverie(argv[1:], relaxed=True)):
                bad.append(f"{span}\n    as {shlex.join(argv)}: {error}")
    assert not bad, "\n".join(bad)


def test_every_subcommand_is_in_the_commands_table() -> None:
    # The other way round: a command added to the parser gets a row.
    rows = [line for line in _readme().splitlines() if line.startswith("| `reverie ")]
    named = {row.split()[2].strip("`") for row in rows}
    assert sorted(set(_reverie_command(False).commands) - named) == []


def test_every_option_named_alone_is_an_option_of_the_command() -> None:
    options = {o for c in _all_commands(_reverie_command(False)) for p in c.params
               for o in [*p.opts, *p.secondary_opts] if o.startswith("-")}
    alone = [s for s in spans() if re.match(r"--?[a-z]", s.text)]
    assert alone
    assert [str(s) for s in alone if s.text.split()[0] not in options] == []


def test_every_command_of_a_shell_block_is_known() -> None:
    known = {"reverie", "prefect", "make", "export", *OUTSIDE_COMMANDS}
    assert [f"{_where(n)}: {shlex.join(w)}" for n, w in shell_lines()
            if _program(w[0]) not in known] == []


def test_every_make_target_named_exists() -> None:
    named = [(str(s), s.text.split()[1:]) for s in _spans_starting("make")]
    named += [(f"{_where(n)}: {shlex.join(w)}", w[1:]) for n, w in shell_lines()
              if w[0] == "make"]
    assert named
    targets = makefile()
    assert [f"{where}: no target {t!r}" for where, ts in named for t in ts
            if t not in targets] == []


def test_the_quick_start_is_make_demo_then_make_test() -> None:
    first = next(b for b in blocks() if b.info in ("sh", "bash"))
    assert [shlex.split(line, comments=True) for line in first.text.splitlines()] == [
        ["make", "demo"], ["make", "test"]]


def test_make_demo_runs_reverie_demo_which_the_cli_tests_run_as_is() -> None:
    """`make demo` itself makes a virtualenv (minutes); what it then runs is one reverie
    command, which tests/test_cli.py runs in a folder of its own, with the sample store."""
    import test_cli

    (recipe,) = makefile()["demo"]
    program, *argv = shlex.split(recipe)
    assert program == "$(BIN)/reverie" and parse_reverie(argv, relaxed=False) is None
    source = inspect.getsource(test_cli.test_demo_ingests_the_sample_and_reports)
    assert f"main({argv!r})".replace("'", '"') in source


def make_variables() -> dict[str, str]:
    """The Makefile's simply-expanded variables, as make's own database gives them."""
    done = subprocess.run(["make", "-pRrq", "-f", "Makefile", ":"], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    return dict(line.split(" := ", 1) for line in done.stdout.splitlines()
                if re.match(r"^[A-Z_]+ := ", line))


def test_make_test_runs_the_suite_on_sqlite_and_on_postgresql() -> None:
    targets, variables = makefile(), make_variables()
    pytest_, sqlite, postgres = (variables[name] for name in ("PYTEST", "SQLITE_LEG",
                                                                "POSTGRES_LEG"))
    assert "-m pytest" in pytest_ and " -n " in pytest_
    assert sqlite.startswith(pytest_) and "REVERIE_TEST_POSTGRES" not in sqlite
    # The PostgreSQL leg checks its trace of the store's code (tests/legs.py).
    assert postgres.startswith("REVERIE_TEST_POSTGRES=") and pytest_ in postgres
    assert "REVERIE_TEST_STORE_COVERAGE=1" in postgres
    # Each leg keeps its every test's time, in a file of its own.
    junit = [re.findall(r"--junitxml=(\S+)", leg) for leg in (sqlite, postgres)]
    assert all(len(files) == 1 for files in junit) and junit[0] != junit[1]
    # `make test` runs both legs (side by side); each can run alone.
    recipe = "\n".join(targets["test"])
    assert "$(SQLITE_LEG)" in recipe and "$(POSTGRES_LEG)" in recipe
    # Under its load the SQLite leg's stacks keep Prefect's database on PostgreSQL too.
    assert "REVERIE_TEST_PREFECT_POSTGRES=$(TEST_POSTGRES) $(SQLITE_LEG)" in recipe
    # Side by side, both legs share the tests that reach no store through one folder,
    # emptied first and set before either leg starts (tests/legs.py's ``claim``).
    shared = "export REVERIE_TEST_SHARED=$(CURDIR)/$(TEST_LOGS)/shared"
    assert "rm -rf $(TEST_LOGS)/shared" in recipe
    assert recipe.index("rm -rf $(TEST_LOGS)/shared") < recipe.index(shared) \
        < recipe.index("$(POSTGRES_LEG)") < recipe.index("$(SQLITE_LEG)")
    assert "REVERIE_TEST_SHARED" not in sqlite + postgres  # alone, a leg runs its own
    assert targets["test-sqlite"] == ["$(SQLITE_LEG)"]
    assert targets["test-postgres"] == ["$(POSTGRES_LEG)"]
    assert "postgres" in targets and "chromium" in targets


def test_every_reverie_command_a_make_target_runs_parses() -> None:
    for target, recipe in makefile().items():
        for line in recipe:
            program, *argv = shlex.split(line)
            if program == "$(BIN)/reverie":
                assert parse_reverie(argv, relaxed=False) is None, f"make {target}: {line}"


def test_prefect_commands_parse_and_name_this_projects_deployments_and_pool() -> None:
    """Prefect's commands are parsed by Prefect's own command line (cyclopts), without
    running them; what they name of this project must be in prefect.yaml."""
    from prefect.cli._app import _app

    lines = [(str(s), shlex.split(s.text)) for s in _spans_starting("prefect", ".venv/bin/prefect")]
    lines += [(_where(n), w) for n, w in shell_lines() if _program(w[0]) == "prefect"]
    assert len(lines) >= 5
    bad = []
    for where, words in lines:
        argv = words[1:]
        try:
            _app.parse_args(argv, exit_on_error=False, print_error=False)
        except Exception as exc:  # noqa: BLE001 - cyclopts' errors share no base worth naming
            bad.append(f"{where}: {shlex.join(words)}: {exc}")
        if argv[:2] == ["deployment", "run"]:
            if argv[2] not in deployments():
                bad.append(f"{where}: no deployment {argv[2]!r} in prefect.yaml")
            params = [v.split("=", 1)[0] for o, v in zip(argv, argv[1:], strict=False)
                      if o == "--param"]
            bad += [f"{where}: {argv[2]} takes no parameter {p!r}" for p in params
                    if p not in deployments().get(argv[2], [])]
        pools = [v for o, v in zip(argv, argv[1:], strict=False) if o == "--pool"]
        if argv[:2] == ["work-pool", "create"]:
            pools.append(argv[2])
        bad += [f"{where}: the work pool is {work_pool()!r}, not {p!r}" for p in pools
                if p != work_pool()]
    assert not bad, "\n".join(bad)


def test_every_deployment_named_is_in_prefect_yaml() -> None:
    top = {p.name for p in ROOT.iterdir()}
    named = [s for s in spans() if re.fullmatch(r"[a-z][a-z0-9-]*/[a-z][a-z0-9-]*", s.text)
             and s.text.split("/")[0] not in top and s.text not in OUTSIDE_NAMES]
    assert len(named) >= 8
    assert [str(s) for s in named if s.text not in deployments()] == []


# --- settings, config, presets ------------------------------------------------------------


def test_every_environment_variable_named_is_read() -> None:
    """A REVERIE_ variable is a setting (and a value given with it is one the setting
    takes), or a switch of the test suite; a PREFECT_ one is Prefect's setting; any other
    is read by Reverie's code or is in OUTSIDE_NAMES."""
    import prefect.settings

    named = [s for s in spans() if re.fullmatch(r"\$?[A-Z][A-Z0-9]*_[A-Z0-9_]+(=.*)?", s.text)]
    named += [Span(n, w[1]) for n, w in shell_lines() if w[0] == "export"]
    assert len(named) > 30
    fields = Settings.model_fields
    bad = []
    for span in named:
        name, _, value = span.text.lstrip("$").partition("=")
        name, value = name.strip(), value.strip()
        if name in OUTSIDE_NAMES:
            continue
        if name.startswith("REVERIE_"):
            field = name.removeprefix("REVERIE_").lower()
            if field in fields:
                if value:
                    try:
                        Settings(**{field: value})
                    except ValueError as exc:
                        bad.append(f"{span}: {exc}")
            elif name not in code(tests=True).strings:
                bad.append(f"{span}: no setting {field!r} in models/settings.py")
        elif name.startswith("PREFECT_"):
            if not hasattr(prefect.settings, name):
                bad.append(f"{span}: Prefect has no setting {name}")
            elif re.fullmatch(r"prefect(\.\w+)+", value) and not importlib.util.find_spec(value):
                bad.append(f"{span}: no module {value}")
        elif name not in code().strings:
            bad.append(f"{span}: not read by Reverie (add it to OUTSIDE_NAMES if not ours)")
    assert not bad, "\n".join(bad)


def test_the_settings_table_gives_each_settings_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row names one or more variables and as many defaults, in order: a quoted value,
    "unset" (None), or words (not checked). Paths under ~ are the defaults without the
    XDG variables."""
    for variable in ("XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    rows = [line for line in _readme().splitlines() if line.startswith("| `REVERIE_")]
    assert len(rows) > 15
    bad = []
    for row in rows:
        names_cell, defaults_cell = row.split(" | ")[:2]
        names = re.findall(r"`REVERIE_(\w+)`", names_cell)
        defaults = defaults_cell.split(", ")
        if len(defaults) != len(names):
            bad.append(f"{row[:60]}...: {len(names)} variables, {len(defaults)} defaults")
            continue
        for name, given in zip(names, defaults, strict=True):
            field = Settings.model_fields.get(name.lower())
            if field is None:
                continue  # the variables test names it
            actual = field.get_default(call_default_factory=True)
            quoted = re.match(r"`([^`]*)`", given.strip())
            if quoted:
                text = quoted.group(1).replace("~", str(Path.home()))
                same = (str(actual) == text or (isinstance(actual, bool) and str(actual).lower() == text)
                        or (isinstance(actual, int | float) and not isinstance(actual, bool)
                            and re.fullmatch(r"[\d.]+", text) and float(text) == actual))
            elif given.strip() == "unset":
                same = actual is None
            else:
                continue
            if not same:
                bad.append(f"REVERIE_{name}: the README says {given.strip()}, the default is {actual!r}")
    assert not bad, "\n".join(bad)


def test_every_config_knob_named_exists_and_takes_the_value_given() -> None:
    named = [s for s in spans() if s.text.startswith("config.")]
    assert named
    bad = []
    for span in named:
        path, _, value = span.text.removeprefix("config.").partition("=")
        keys = path.strip().split(".")
        model: type = ConsolidationConfig
        for key in keys:
            fields = getattr(model, "model_fields", {})
            if key not in fields:
                bad.append(f"{span}: {model.__name__} has no field {key!r}")
                break
            model = fields[key].annotation
        else:
            if value.strip():
                update: object = ast.literal_eval(value.strip())
                for key in reversed(keys):
                    update = {key: update}
                try:
                    ConsolidationConfig.model_validate(update)
                except ValueError as exc:
                    bad.append(f"{span}: {exc}")
    assert not bad, "\n".join(bad)


def test_every_preset_named_exists() -> None:
    text = _readme()
    named = re.findall(r"preset `([^`]+)`", text)
    row = next(line for line in text.splitlines() if line.startswith("| `REVERIE_PRESET`"))
    named += [n for n in re.findall(r"`([^`]+)`", row.split("|")[3]) if "/" not in n]
    assert len(named) >= 5
    assert [n for n in named if n not in PRESETS] == []


# --- files and Python names ---------------------------------------------------------------


def test_every_file_named_exists() -> None:
    top = {p.relative_to(ROOT).parts[0] for p in repo_files()}
    names = {p.name for p in repo_files()}
    bad, seen = [], 0
    for span in spans():
        for word in span.text.split():
            if "://" in word or word[0] in "~$/<":
                continue
            in_repo = "/" in word and word.split("/")[0] in top
            if not (in_repo or word.endswith(PATH_ENDINGS)):
                continue
            seen += 1
            if in_repo:
                found = (ROOT / word).exists()
            else:  # a file named by itself: somewhere in the package
                found = word in names
            if not found:
                bad.append(f"{span}: no {word}")
    assert seen > 10
    assert not bad, "\n".join(bad)


def test_every_python_name_named_resolves() -> None:
    """`Class` and `Class.attribute` name a class of the package (found by name, wherever
    it is defined); `reverie.a.b` imports; `function(...)` is defined in the package."""
    bad, seen = [], 0
    for span in spans():
        text = span.text
        if re.fullmatch(r"[A-Z][a-z0-9]\w*(\.\w+)*", text):
            seen += 1
            name, *attributes = text.split(".")
            if name not in code().classes:
                bad.append(f"{span}: no class {name} in the package")
                continue
            target: object = getattr(importlib.import_module(code().classes[name]), name)
            for attribute in attributes:
                if not hasattr(target, attribute):
                    bad.append(f"{span}: {name} has no {attribute!r}")
                    break
                target = getattr(target, attribute)
        elif re.fullmatch(r"reverie(\.[\w<>]+)+", text):
            seen += 1
            if not _importable(text) and not any(
                    s.startswith(text.split("<")[0]) for s in code().strings):
                bad.append(f"{span}: neither a module, a module's attribute nor an event name")
        elif re.fullmatch(r"[a-z_]\w*\(.*\)", text):
            seen += 1
            if text.split("(")[0] not in code().functions:
                bad.append(f"{span}: no function {text.split('(')[0]} in the package")
    assert seen > 10
    assert not bad, "\n".join(bad)


def _importable(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
        if found is not None:
            target: object = importlib.import_module(module)
            for attribute in parts[cut:]:
                if not hasattr(target, attribute):
                    return False
                target = getattr(target, attribute)
            return True
    return False


def test_every_identifier_named_is_in_the_code() -> None:
    """A snake_case name in the prose or a drawing (a field, a parameter, a step, a
    table) is an identifier or a string of the package's code, or of prefect.yaml."""
    texts = [s for s in spans() if not (
        s.text.startswith(("config.", "reverie ", "make ", "prefect ")) or re.match(r"[A-Z]", s.text))]
    texts += [Span(b.line, b.text) for b in blocks() if not b.info]  # drawings
    bad, seen = [], 0
    for span in texts:
        for name in re.findall(r"(?<![\w./-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w(./-])",
                               span.text):
            seen += 1
            if not in_code(name):
                bad.append(f"{_where(span.line)}: {name!r} is not in the code")
    assert seen > 30
    assert not bad, "\n".join(bad)


def test_the_architecture_drawing_names_modules_of_their_folders() -> None:
    """In the layer drawing, `folder/   a · b (what b is) · c` names modules (or
    subfolders) of that folder; a line that carries on names more of them."""
    drawing = next(b for b in blocks() if not b.info and "models/" in b.text and " · " in b.text)
    bad, seen, folder = [], 0, None
    for n, line in enumerate(drawing.text.splitlines()):
        line = re.sub(r"\s*·\s*", " · ", re.sub(r"\([^)]*\)", "", line.replace("│", " ")))
        for chunk in re.split(r"\s{2,}", line.strip()):
            if re.fullmatch(r"[a-z]+/", chunk):
                folder = chunk
            elif folder and " · " in chunk:
                for name in (w.strip().removesuffix("/*") for w in chunk.split("·")):
                    seen += 1
                    if not ((ROOT / folder / f"{name}.py").is_file() or (ROOT / folder / name).is_dir()):
                        bad.append(f"{_where(drawing.line + n)}: no {folder}{name}")
    assert seen > 25
    assert not bad, "\n".join(bad)


# --- Python snippets ----------------------------------------------------------------------


def _python_blocks() -> list[Block]:
    """Python blocks, less those another test runs against what they need (marked
    ``<!-- readme-test: NAME -->``: the agent loop needs `reverie api`, see
    tests/test_readme_agents.py)."""
    lines = _readme().splitlines()
    return [b for b in blocks() if b.info in ("python", "py")
            and not any(line.startswith("<!-- readme-test:")
                        for line in lines[max(0, b.line - 3):b.line])]


@pytest.mark.parametrize("block", _python_blocks(), ids=lambda b: f"README.md:{b.line}")
def test_a_python_snippet_runs_as_written(
    block: Block, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a fresh store that REVERIE_DATABASE_URL names (a snippet needing data must
    make it), in a folder of its own."""
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__readme__"}
    exec(compile(block.text, f"README.md:{block.line}", "exec"), namespace)  # noqa: S102
    _SNIPPET_CHECKS.get(block.text.split("\n", 1)[0], lambda ns: None)(namespace)


def _check_from_python(ns: dict[str, object]) -> None:
    # What the snippet's comments promise: it stored, found and counted the memory.
    [hit] = ns["hits"]  # type: ignore[misc]
    assert hit.memory.external_id == "a1" and hit.memory.access_count == 0
    [hot] = ns["hot"]  # type: ignore[misc]
    assert hot.content == "Alice drinks green tea" and hot.access_count == 1


# A snippet's results, checked by its first line (the snippet runs whatever it holds).
_SNIPPET_CHECKS = {"from reverie.engines.embedding import embedder_for": _check_from_python}


def test_every_snippet_check_still_finds_its_snippet() -> None:
    assert set(_SNIPPET_CHECKS) <= {b.text.split("\n", 1)[0] for b in _python_blocks()}
