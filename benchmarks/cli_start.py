"""How fast does the ``reverie`` command start, against the argparse CLI it replaced?

Issue #39 asks the typer CLI to start no slower than the argparse one of e4a754d. That
module is taken from git (``git show e4a754d:deployments/cli.py``), its imports of
modules that have moved since pointed at their new place (``MOVED``), and written to a
scratch folder; both run in this virtualenv on the same library code, so what differs is
the command-line module alone. Each command runs as whole processes, in pairs, the new
then the old, one pair after the other (A B A B ...), after one untimed run of each;
each process's CPU (user + system, from ``wait4``) and wall time are kept. Both read
their compiled bytecode from a cache in the scratch folder, written by the untimed run,
as an installed command reads its ``.pyc`` files: with PYTHONDONTWRITEBYTECODE set (as
in our shells) every run would compile every module of both from source, and the two
command-line modules' sources differ in size. The figures
are medians, and each pair's ratio new/old (median, min and max): a ratio at most 1.00
is "no slower". The machine's load average is recorded before and after, as the
machine is shared.

The store is a scratch SQLite file: the bundled sample store, ingested with the real
model, then decayed, deduplicated and compressed in this process (no Prefect), so that
``consolidations`` has decisions to list. No Prefect API is configured, as for a local
user. Output is discarded (it is memory content); each command's output of the new and
the old CLI is compared, and a difference is reported by command name only.

    python -m reverie.benchmarks.cli_start --pairs 9 --json benchmarks/results/cli-start.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BASELINE_COMMIT = "e4a754d"
# Modules the argparse CLI imported that have moved since (issue #39 item 4, "rooms").
MOVED = {
    "reverie.engines.recall": "reverie.recall.search",
    "reverie.flows.event_delivery": "reverie.runner.event_delivery",
    "reverie.flows.progress": "reverie.runner.progress",
    "reverie.flows.report": "reverie.runner.report",
    "reverie.flows.runtime": "reverie.runner.runtime",
    "reverie.flows.temporary_server": "reverie.runner.temporary_server",
}
PROFILE = "maya"
AS_OF = datetime(2025, 7, 1)
# The commands issue #39 names, as a user types them (after `reverie`).
COMMANDS: dict[str, tuple[str, ...]] = {
    "--help": ("--help",),
    "run --help": ("run", "--help"),
    "status": ("status",),
    "get": ("get", "maya-001"),
    "recall": ("recall", "what does Maya work on", "--profile", PROFILE),
    "export": ("export", "--profile", PROFILE),
    "consolidations": ("consolidations", "--profile", PROFILE),
}
# What the `reverie` executable runs ([project.scripts]).
NEW = "from reverie.deployments.executable import console; console()"
OLD = "import sys; sys.path.insert(0, {folder!r}); from cli_argparse import console; console()"


@dataclass(frozen=True)
class Sample:
    """One process: its CPU seconds (user + system) and wall seconds."""

    cpu: float
    wall: float


@dataclass(frozen=True)
class Row:
    """One command: medians of each side, and the pairwise ratios new/old."""

    command: str
    pairs: int
    new_cpu_s: float
    old_cpu_s: float
    cpu_ratio: float
    cpu_ratio_min: float
    cpu_ratio_max: float
    new_wall_s: float
    old_wall_s: float
    wall_ratio: float
    wall_ratio_min: float
    wall_ratio_max: float
    same_output: bool
    verdict: str


TARGET = "CPU and wall <= 1.00x the argparse CLI (median of pairs)"


def summarize(command: str, pairs: Sequence[tuple[Sample, Sample]], same_output: bool) -> Row:
    """A command's row from its (new, old) pairs: pure, so the verdict is tested."""
    cpu = [new.cpu / old.cpu for new, old in pairs]
    wall = [new.wall / old.wall for new, old in pairs]
    cpu_ratio, wall_ratio = statistics.median(cpu), statistics.median(wall)
    met = cpu_ratio <= 1.0 and wall_ratio <= 1.0
    return Row(
        command=command, pairs=len(pairs),
        new_cpu_s=round(statistics.median(n.cpu for n, _ in pairs), 4),
        old_cpu_s=round(statistics.median(o.cpu for _, o in pairs), 4),
        cpu_ratio=round(cpu_ratio, 3), cpu_ratio_min=round(min(cpu), 3),
        cpu_ratio_max=round(max(cpu), 3),
        new_wall_s=round(statistics.median(n.wall for n, _ in pairs), 4),
        old_wall_s=round(statistics.median(o.wall for _, o in pairs), 4),
        wall_ratio=round(wall_ratio, 3), wall_ratio_min=round(min(wall), 3),
        wall_ratio_max=round(max(wall), 3),
        same_output=same_output,
        verdict="met" if met else f"missed: {max(cpu_ratio, wall_ratio):.3f}x",
    )


def old_module(source: str) -> str:
    """The argparse CLI's text with the moved modules' imports pointed at their place."""
    for old, new in MOVED.items():
        source = source.replace(f"from {old} import", f"from {new} import")
    return source


def _write_old_cli(folder: Path, commit: str) -> None:
    source = subprocess.run(["git", "show", f"{commit}:deployments/cli.py"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    (folder / "cli_argparse.py").write_text(old_module(source), encoding="utf-8")


def _make_store(url: str) -> None:
    """The sample store, with consolidation decisions, made the way a user would: the
    new CLI's ingest, then the steps (rules summaries) without Prefect."""
    from reverie.demo.run import SAMPLE_STORE

    subprocess.run([sys.executable, "-c", NEW, "ingest", str(SAMPLE_STORE)], check=True,
                   stdout=subprocess.DEVNULL, env=_env(url))
    from reverie.models.config import ConsolidationConfig
    from reverie.models.store import Store
    from reverie.tasks.compress import compress_fading
    from reverie.tasks.decay import decay
    from reverie.tasks.dedup import dedup
    from reverie.tasks.step import StepArgs

    store = Store(url)
    args = StepArgs(url, PROFILE, AS_OF, ConsolidationConfig(summarizer="rules"))
    for step in (decay, dedup, compress_fading):
        step(store, args)


def _env(url: str, pycache: Path | None = None) -> dict[str, str]:
    # A local user's environment: no Prefect API, the model offline.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_API") and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(REVERIE_DATABASE_URL=url, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PREFECT_SERVER_ANALYTICS_ENABLED="false")
    if pycache is not None:
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _run(code: str, words: Sequence[str], env: dict[str, str]) -> tuple[Sample, bytes]:
    started = time.perf_counter()
    with subprocess.Popen([sys.executable, "-c", code, *words], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
        out = proc.stdout.read() if proc.stdout else b""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    if proc.returncode not in (0, None):
        raise RuntimeError(f"`reverie {' '.join(words[:1])}` exited {proc.returncode}")
    return Sample(usage.ru_utime + usage.ru_stime, wall), out


def measure(pairs: int, commands: Sequence[str], commit: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="reverie-cli-start-") as scratch:
        folder = Path(scratch)
        _write_old_cli(folder, commit)
        url = f"sqlite:///{folder / 'store.db'}"
        _make_store(url)
        env = _env(url, folder / "pycache")
        old = OLD.format(folder=str(folder))
        load_before = os.getloadavg()
        rows = []
        for name in commands:
            words = COMMANDS[name]
            _, new_out = _run(NEW, words, env)  # warm: files in the page cache, .pyc written
            _, old_out = _run(old, words, env)
            # Help is worded by each library its own way; every other output must match.
            same = name.endswith("--help") or new_out == old_out
            measured = []
            for _ in range(pairs):
                new_sample, _ = _run(NEW, words, env)
                old_sample, _ = _run(old, words, env)
                measured.append((new_sample, old_sample))
            row = summarize(name, measured, same)
            rows.append(row)
            print(f"{name:<16} new {row.new_cpu_s:.3f} s  old {row.old_cpu_s:.3f} s CPU  "
                  f"{row.cpu_ratio:.3f}x ({row.cpu_ratio_min:.2f}-{row.cpu_ratio_max:.2f})  "
                  f"wall {row.wall_ratio:.3f}x ({row.wall_ratio_min:.2f}-"
                  f"{row.wall_ratio_max:.2f})  {'' if same else 'OUTPUT DIFFERS  '}"
                  f"[{row.verdict}]", flush=True)
        load_after = os.getloadavg()
    return {
        "command": f"python -m reverie.benchmarks.cli_start --pairs {pairs}",
        "baseline": f"the argparse CLI of {commit} (deployments/cli.py), same virtualenv",
        "bytecode": "cached (PYTHONPYCACHEPREFIX in the scratch folder), as installed",
        "target": TARGET,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
        "starts": [asdict(r) for r in rows],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reverie.benchmarks.cli_start",
        description="Start-up of the reverie command against the argparse CLI it replaced.")
    parser.add_argument("--pairs", type=int, default=9, choices=range(1, 101), metavar="N",
                        help="interleaved pairs per command, 1-100 (default 9)")
    parser.add_argument("--commands", default=",".join(COMMANDS), metavar="NAMES",
                        help=f"comma-separated, of: {', '.join(COMMANDS)}")
    parser.add_argument("--baseline", default=BASELINE_COMMIT, metavar="COMMIT")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the rows as JSON")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.commands.split(",") if n.strip()]
    unknown = [n for n in names if n not in COMMANDS]
    if unknown:
        parser.error(f"unknown command(s): {', '.join(unknown)}")
    result = measure(args.pairs, names, args.baseline)
    print(f"load average before {result['load_before']}, after {result['load_after']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
