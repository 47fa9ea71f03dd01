"""BENCHMARKS.md, generated: every target with its latest figure, verdict and command.

The inputs are the JSON files committed in ``benchmarks/results/``: what ``reverie bench
synthetic --json`` and ``reverie bench api --json`` wrote, as they wrote them, and one
file of figures carried by hand from the dated rounds (``docs/benchmarks-history.md``)
for targets no fresh JSON measures. ``sources.json`` lists the files in order and gives
each bench run the date, commit and machine state its JSON does not record.

``plan`` reads them into plain target rows, the latest measurement of each target
winning (a newer JSON of the same target replaces a carried figure); ``render`` writes
the page. ``python -m reverie.benchmarks.report`` (``make docs``) rewrites BENCHMARKS.md;
``--check`` fails when the page differs from what the JSON makes, as
``tests/test_benchmarks_report.py`` does.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from reverie.benchmarks.local_command import BENCH as LOCAL_COMMAND

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "BENCHMARKS.md"
HISTORY = "docs/benchmarks-history.md"


class Bench(StrEnum):
    """The groups of targets, in the order the page shows them."""

    SYNTHETIC = "synthetic"
    API = "api"
    EMBEDDING = "embedding"
    UPDATES = "updates"
    LOCOMO = "locomo"
    PLATFORM = "platform"
    START = "start"
    SUITE = "suite"


BENCH_TITLES = {
    Bench.SYNTHETIC: "speed of every step (`reverie bench synthetic`)",
    Bench.API: "the agent API (`reverie bench api`)",
    Bench.EMBEDDING: "embedding and ingest",
    Bench.UPDATES: "updated facts (`reverie bench updates`)",
    Bench.LOCOMO: "no fact lost (`reverie bench locomo`)",
    Bench.PLATFORM: "the platform",
    Bench.START: "command start-up (`python -m reverie.benchmarks.cli_start`)",
    Bench.SUITE: "the test suite",
}


@dataclass(frozen=True)
class Run:
    """Where a JSON came from, which it does not say itself."""

    date: str
    commit: str
    machine: str
    command: str
    file: str


@dataclass(frozen=True)
class Target:
    """One target's latest measurement."""

    bench: Bench
    key: str
    target: str
    figure: str
    verdict: str
    date: str
    commit: str
    machine: str
    command: str
    source: str  # the results file, or the history section a carried figure came from
    carried: bool = False

    @property
    def met(self) -> bool:
        return self.verdict == "met"


# --- reading the JSON: pure functions on plain data --------------------------------------


def synthetic_targets(data: dict[str, Any], run: Run) -> list[Target]:
    """A row of ``bench synthetic`` may hold several targets ("<= 10 s; recall >= 0.99"):
    one target each, so a later run measuring only one of them replaces only that one."""
    out = []
    for row in data["results"]:
        if not row.get("target"):
            continue
        targets = row["target"].split("; ")
        verdicts = row["verdict"].split("; ")
        for target, verdict in zip(targets, verdicts, strict=True):
            if target.startswith("recall"):
                figure = f"recall {row['recall']:.4f}"
            elif target.startswith("<="):
                figure = f"{row['seconds']:.3f} s"
            else:
                figure = "; ".join(row.get("notes", [])) or f"{row['seconds']:.3f} s"
            if row.get("backend", "sqlite") != "sqlite":
                figure += f" ({row['backend']})"
            n = int(row["n"])
            key = f"synthetic|{row['task']}|{n}|{target}"
            out.append(Target(Bench.SYNTHETIC, key, f"{row['task']} of {n:,} memories: {target}",
                              figure, verdict, run.date, run.commit, run.machine,
                              run.command, run.file))
    return out


def api_targets(data: dict[str, Any], run: Run) -> list[Target]:
    """Recall's target is one row; store's is judged on every row, so its rows are one
    target per batch size, with the range of shares measured."""
    out = []
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in data["rows"]:
        if not row.get("target"):
            continue
        batch = next((n for n in row.get("notes", []) if n.endswith("per call")), "")
        groups.setdefault((row["operation"], row["target"], batch), []).append(row)
    for (operation, target, batch), rows in groups.items():
        if len(rows) == 1 and operation == "recall":
            r = rows[0]
            text = (f"recall through `reverie api`, {r['clients']} clients, "
                    f"{r['memories_per_profile']:,} memories per profile: {target}")
            figure = (f"p95 {r['p95_ms']:.1f} ms (p50 {r['p50_ms']:.1f} ms, "
                      f"{r['calls_per_second']:.1f} calls/s)")
            verdict = r["verdict"]
        else:
            shares = sorted(int(n.split("%")[0]) for r in rows for n in r.get("notes", [])
                            if n.endswith("% of ingest"))
            met = sum(r["verdict"] == "met" for r in rows)
            sizes = sorted({r["memories_per_profile"] for r in rows})
            clients = sorted({r["clients"] for r in rows})
            text = (f"{operation} through `reverie api`, {batch}, "
                    f"{' and '.join(f'{s:,}' for s in sizes)} memories: {target}")
            figure = (f"{shares[0]}% to {shares[-1]}% of ingest with "
                      f"{', '.join(map(str, clients))} clients" if shares else "")
            verdict = ("met" if met == len(rows)
                       else f"missed in {len(rows) - met} of {len(rows)} rows")
        out.append(Target(Bench.API, f"api|{operation}|{target}|{batch}", text, figure, verdict,
                          run.date, run.commit, run.machine, run.command, run.file))
    rates = data.get("ingest") or {}
    if rates.get("ingest") and rates.get("raw_model"):
        share = rates["ingest"] / rates["raw_model"]
        figure = f"{rates['ingest']:,.0f} sentences/s; raw model {rates['raw_model']:,.0f}"
        out.append(Target(Bench.EMBEDDING, "ingest|>= 600 sentences/s",
                          "ingest with the model (OpenVINO) >= 600 sentences/s", figure,
                          "met" if rates["ingest"] >= 600 else "missed",
                          run.date, run.commit, run.machine, run.command, run.file))
        out.append(Target(Bench.EMBEDDING, "ingest|>= 90% of raw model",
                          "ingest with the model >= 90% of the raw model's rate",
                          f"{share:.1%} ({figure})",
                          "met" if share >= 0.90 else f"missed: {share:.1%}",
                          run.date, run.commit, run.machine, run.command, run.file))
    return out


def local_command_targets(data: dict[str, Any], run: Run) -> list[Target]:
    """``benchmarks/local_command.py``: the command's wall clock beyond the steps' own
    clocks, medians over the runs, and the A/B ratios when it had a baseline."""
    this = data["variants"][0]
    figure = (f"{this['wall_median']:.2f} s wall ({this['wall_min']:.2f}-{this['wall_max']:.2f})"
              f" for {this['work_median']:.2f} s of work: {this['beyond_median']:.2f} s beyond"
              f" it; CPU {this['cpu_median']:.2f} s")
    if len(data["variants"]) > 1:
        figure += (f"; against {data['variants'][1]['name']}, pair by pair: wall "
                   f"x{data['wall_ratio_median']:.2f}, CPU x{data['cpu_ratio_median']:.2f}")
    target = f"{data['target']} (`{data['timed']}` on the sample store)"
    return [Target(Bench.PLATFORM, "platform|local command", target, figure,
                   data["verdict"], run.date, run.commit, run.machine, run.command, run.file)]


def local_command_table(data: dict[str, Any]) -> list[str]:
    lines = ["| variant | runs | wall median s | wall min-max s | CPU median s | work median s "
             "| beyond median s | load |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for v in data["variants"]:
        lines.append(f"| {_cell(v['name'])} | {v['runs']} | {v['wall_median']:.3f} | "
                     f"{v['wall_min']:.3f}-{v['wall_max']:.3f} | {v['cpu_median']:.3f} | "
                     f"{v['work_median']:.3f} | {v['beyond_median']:.3f} | "
                     f"{min(v['load']):.1f}-{max(v['load']):.1f} |")
    return lines


def start_targets(data: dict[str, Any], run: Run) -> list[Target]:
    """One target per command: it starts no slower than the argparse CLI it replaced."""
    out = []
    for row in data["starts"]:
        figure = (f"CPU {row['cpu_ratio']:.2f}x ({row['cpu_ratio_min']:.2f}-"
                  f"{row['cpu_ratio_max']:.2f}), wall {row['wall_ratio']:.2f}x "
                  f"({row['wall_ratio_min']:.2f}-{row['wall_ratio_max']:.2f}); "
                  f"{row['new_cpu_s']:.3f} s CPU against {row['old_cpu_s']:.3f} s, "
                  f"{row['pairs']} pairs")
        out.append(Target(Bench.START, f"start|{row['command']}",
                          f"`reverie {row['command']}` starts no slower than the argparse CLI: "
                          f"{data['target']}", figure, row["verdict"], run.date, run.commit,
                          run.machine, run.command, run.file))
    return out


def carried_targets(data: dict[str, Any]) -> list[Target]:
    return [Target(Bench(c["bench"]), c["key"], c["target"], c["figure"], c["verdict"],
                   c["date"], c["commit"], c["machine"], c["command"], c["source"],
                   carried=True)
            for c in data["carried"]]


def targets_of(data: dict[str, Any], run: Run | None) -> list[Target]:
    """The targets one results file measures, whatever bench wrote it."""
    if "carried" in data:
        return carried_targets(data)
    if run is None:
        raise ValueError("a bench's JSON needs its date, commit and machine in sources.json")
    if "results" in data:
        return synthetic_targets(data, run)
    if "rows" in data:
        return api_targets(data, run)
    if data.get("bench") == LOCAL_COMMAND:
        return local_command_targets(data, run)
    if "starts" in data:
        return start_targets(data, run)
    raise ValueError(f"{run.file}: not a results file this report knows")


def latest(targets: Iterable[Target]) -> list[Target]:
    """Each target once, its latest measurement (by date; on a tie, the file listed
    later), grouped by bench in the page's order, first appearance order within."""
    chosen: dict[str, Target] = {}
    for t in targets:
        if t.key not in chosen or t.date >= chosen[t.key].date:
            chosen[t.key] = t
    order = list(Bench)
    return sorted(chosen.values(), key=lambda t: order.index(t.bench))


Source = tuple[dict[str, Any], dict[str, Any]]  # (its entry in sources.json, its JSON)
RunTable = tuple[Run, dict[str, Any]]


def plan(files: Sequence[Source]) -> tuple[list[Target], list[RunTable]]:
    """From (source entry, its file's JSON) pairs: the targets, and the bench runs whose
    full tables the page shows."""
    found: list[Target] = []
    runs: list[RunTable] = []
    for entry, data in files:
        run = None
        if "carried" not in data:
            run = Run(entry["date"], entry["commit"], entry["machine"], data["command"],
                      entry["file"])
            runs.append((run, data))
        found += targets_of(data, run)
    return latest(found), runs


# --- the page -----------------------------------------------------------------------------


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _verdict(t: Target) -> str:
    return t.verdict if t.met else f"**{t.verdict}**"


def _measured(t: Target) -> str:
    where = f"{t.date}, {t.commit}, {t.machine}"
    if t.carried:
        return f"{where}; carried by hand from {t.source}"
    return f"{where}; [{t.source}](benchmarks/results/{t.source})"


def targets_table(targets: Sequence[Target]) -> list[str]:
    lines = ["| | target | latest figure | verdict | measured | to reproduce |",
             "|---|---|---|---|---|---|"]
    for t in targets:
        lines.append(f"| {t.bench.value} | {_cell(t.target)} | {_cell(t.figure)} | "
                     f"{_cell(_verdict(t))} | {_cell(_measured(t))} | `{_cell(t.command)}` |")
    return lines


def _number(row: dict[str, Any], key: str, digits: int) -> str:
    value = row.get(key)
    return "" if value is None else f"{value:.{digits}f}"


def start_table(data: dict[str, Any]) -> list[str]:
    lines = [f"Against {data['baseline']}; load average {data['load_before']} before, "
             f"{data['load_after']} after.", "",
             "| command | pairs | CPU s | argparse CPU s | CPU ratio (min-max) | wall s "
             "| argparse wall s | wall ratio (min-max) | same output | verdict |",
             "|---|---:|---:|---:|---|---:|---:|---|---|---|"]
    for r in data["starts"]:
        cpu = f"{r['cpu_ratio']:.3f} ({r['cpu_ratio_min']:.2f}-{r['cpu_ratio_max']:.2f})"
        wall = f"{r['wall_ratio']:.3f} ({r['wall_ratio_min']:.2f}-{r['wall_ratio_max']:.2f})"
        lines.append(f"| `reverie {r['command']}` | {r['pairs']} | {r['new_cpu_s']:.3f} | "
                     f"{r['old_cpu_s']:.3f} | {cpu} | {r['new_wall_s']:.3f} | "
                     f"{r['old_wall_s']:.3f} | {wall} | "
                     f"{'yes' if r['same_output'] else 'no'} | {r['verdict']} |")
    return lines


def synthetic_table(data: dict[str, Any]) -> list[str]:
    lines = ["| task | n | seconds | peak RSS MB | baseline s | recall | target | verdict "
             "| notes |",
             "|---|---:|---:|---:|---:|---:|---|---|---|"]
    for r in data["results"]:
        lines.append(f"| {r['task']} | {r['n']:,} | {_number(r, 'seconds', 3)} | "
                     f"{_number(r, 'peak_rss_mb', 0)} | {_number(r, 'baseline_seconds', 2)} | "
                     f"{_number(r, 'recall', 4)} | {r.get('target', '')} | "
                     f"{r.get('verdict', '')} | {_cell('; '.join(r.get('notes', [])))} |")
    return lines


def api_table(data: dict[str, Any]) -> list[str]:
    lines = []
    rates = data.get("ingest") or {}
    if rates:
        lines += [f"Ingest in the bench's process: {rates['ingest']:,.0f} sentences/s; "
                  f"the raw model {rates['raw_model']:,.0f}.", ""]
    lines += ["| operation | memories/profile | clients | calls | p50 ms | p95 ms | calls/s "
              "| sentences/s | errors | target | verdict |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in data["rows"]:
        rate = r.get("sentences_per_second")
        lines.append(f"| {r['operation']} | {r['memories_per_profile']:,} | {r['clients']} | "
                     f"{r['calls']} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | "
                     f"{r['calls_per_second']:.1f} | {'' if rate is None else f'{rate:.0f}'} | "
                     f"{r['errors']} | {r['target']} | {r['verdict']} |")
    return lines


HEADER = f"""\
# Benchmarks

<!-- Generated by `make docs` (benchmarks/report.py) from benchmarks/results/*.json:
     edit those, not this page. tests/test_benchmarks_report.py fails when they differ. -->

Every target Reverie holds itself to, with its latest measured figure, the verdict and
the command that measures it again. The figures come from the JSON the benches wrote,
committed in `benchmarks/results/` (`sources.json` gives each run's date, commit and
how busy the machine was); targets no fresh run measured carry their last figure from
the dated rounds, copied by hand once and marked so. Every earlier round, with what was
tried, kept or left out and why, is in [the history]({HISTORY}).

To add a run: run the bench with `--json`, put the file in `benchmarks/results/`, list it
in `sources.json` with its date, commit and machine, and run `make docs`; a newer
measurement of a target replaces the older one here.
"""

METHOD = """\
## What is measured

- **`reverie bench synthetic`** (`benchmarks/speed.py`): synthetic stores generated
  with a fixed seed (`benchmarks/synthetic.py`), one profile, vectors supplied with the
  structure of real sentence embeddings (topics, subtopics of about 20 memories, 10% in
  near-duplicate groups). Every step runs once in flow order on one copy (`run_step`, no
  Prefect); every flow runs through Prefect on a second copy. The summaries a step words
  are embedded by the real model inside the step, as the design asks of a compression.
  Baseline and recall: the exact search on the same candidates (sampled above 200,000
  rows). Peak RSS includes what the process already held (Python, the model, Prefect,
  about 0.7 GB). Ingest: 2,048 sentences through `models.ingest.ingest` (validation,
  hashing, embedding, bulk insert) against the raw model on the same sentences.
- **`reverie bench api`** (`benchmarks/api.py`): a real `reverie api` process on a
  store of synthetic profiles, driven by 1, 8 and 32 clients (threads on `http.client`
  keep-alive connections, one each, since 2026-11-27's recall-p95 round; httpx before);
  recall and store latency as the client sees it, and the CPU per call of the server and
  of the clients. Store's sentences per second are compared with ingest's in the bench's
  own process.
- **Command start-up** (`benchmarks/cli_start.py`): each command as whole processes,
  the typer CLI against e4a754d's argparse CLI taken from git into a scratch folder (its
  moved imports pointed at their new place), same virtualenv and library, in interleaved
  pairs on a scratch copy of the sample store with no Prefect API; the median of the
  pairwise ratios of CPU (user + system) and of wall time, with their range.
- **`reverie bench embedding`**, **`reverie bench updates`** and **`reverie bench
  locomo`**: OpenVINO against PyTorch; update chains answered with their newest value;
  answers still found after consolidation on LoCoMo conversations (README, Quality).

## The machine

2 cores of an AMD EPYC (virtual machine), 23.5 GiB memory, no GPU; Linux 6.18, Python
3.11.7, numpy 2.4.6, faiss-cpu 1.15.1, SQLAlchemy 2.0.58, SQLite 3.40.1, the store on
local disk. Each run's JSON records its machine. Other sessions share these cores: a
figure measured on a busy machine says so, and only ratios within one run compare.
"""


def render(targets: Sequence[Target], runs: Sequence[RunTable]) -> str:
    met = sum(t.met for t in targets)
    lines = [HEADER, "## Targets", "",
             f"{len(targets)} targets: {met} met, {len(targets) - met} not met.", ""]
    lines += targets_table(targets)
    lines += ["", "## The latest runs", ""]
    for run, data in runs:
        lines += [f"### `{run.command}`", "",
                  f"{run.date} at {run.commit}, {run.machine}; "
                  f"[{run.file}](benchmarks/results/{run.file}).", ""]
        if data.get("bench") == LOCAL_COMMAND:
            lines += local_command_table(data)
        else:
            lines += (synthetic_table(data) if "results" in data
                      else start_table(data) if "starts" in data else api_table(data))
        lines.append("")
    lines.append(METHOD)
    return "\n".join(lines)


def load(results: Path = RESULTS) -> list[Source]:
    sources = json.loads((results / "sources.json").read_text(encoding="utf-8"))
    return [(entry, json.loads((results / entry["file"]).read_text(encoding="utf-8")))
            for entry in sources["runs"]]


def page(results: Path = RESULTS) -> str:
    return render(*plan(load(results)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reverie.benchmarks.report",
        description="Write BENCHMARKS.md from the benches' JSON in benchmarks/results/.")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--write", type=Path, default=PAGE, help="the page (default BENCHMARKS.md)")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 when the page differs")
    args = parser.parse_args(argv)
    fresh = page(args.results)
    current = args.write.read_text(encoding="utf-8") if args.write.exists() else ""
    if args.check:
        if fresh != current:
            print(f"{args.write} differs from its JSON: run `make docs`", file=sys.stderr)
            return 1
        return 0
    if fresh != current:
        args.write.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
