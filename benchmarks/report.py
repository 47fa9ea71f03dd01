"""BENCHMARKS.md, generated: every target with its latest figure, verdict and command.

The inputs are the JSON files committed in ``benchmarks/results/``: what ``reverie bench
synthetic``, ``api``, ``locomo`` and ``updates`` wrote with ``--json``, as they wrote them;
the test suite's time from a CI run; and one file of figures carried by hand from the
dated rounds (``docs/benchmarks-history.md``) for targets no fresh JSON measures.
``sources.json`` lists the files in order and gives each run the date, commit and
machine state (and, where its JSON lacks it, the command) that the JSON does not record.

``plan`` reads them into plain target rows, the latest measurement of each target
winning (a newer JSON of the same target replaces a carried figure); ``render`` writes
the page. ``page`` is what ``python -m reverie.deployments.docs`` (``make docs``) writes
to BENCHMARKS.md, and what its ``--check`` and ``tests/test_benchmarks_report.py``
compare the page with.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from reverie.benchmarks.local_command import BENCH as LOCAL_COMMAND

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
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
        figure = f"{rates['ingest']:,.0f} sentences/s; raw model {rates['raw_model']:,.0f}"
        if "wall_ratio" in rates:
            # Interleaved runs (since the 2026-11-27 fifteenth session): the verdict is on
            # the median of the pairs' ratios, which the figure names with its range.
            share = rates["wall_ratio"]
            ratio_figure = (
                f"{share:.1%} ({rates['judged_on']}, {rates['runs']} pairs of "
                f"{rates['sentences']:,} sentences, {rates['wall_ratio_min']:.1%}-"
                f"{rates['wall_ratio_max']:.1%}); in CPU {rates['cpu_ratio']:.1%} "
                f"({rates['cpu_ratio_min']:.1%}-{rates['cpu_ratio_max']:.1%}); {figure}")
        else:
            share = rates["ingest"] / rates["raw_model"]
            ratio_figure = f"{share:.1%} ({figure})"
        out.append(Target(Bench.EMBEDDING, "ingest|>= 600 sentences/s",
                          "ingest with the model (OpenVINO) >= 600 sentences/s", figure,
                          "met" if rates["ingest"] >= 600 else "missed",
                          run.date, run.commit, run.machine, run.command, run.file))
        out.append(Target(Bench.EMBEDDING, "ingest|>= 90% of raw model",
                          "ingest with the model >= 90% of the raw model's rate",
                          ratio_figure,
                          "met" if share >= 0.90 else f"missed: {share:.1%}",
                          run.date, run.commit, run.machine, run.command, run.file))
    return out


# What the summaries of each operation must keep (issue #37 item 2): a compression or a
# cold note says every member's statement whole; a merge says once what its members
# nearly all say, so only every number, name and date of theirs must be in it.
FIDELITY_MEASURES = {
    "compression": ("members_kept_whole", "members_whole", "members",
                    "compression summaries say every member whole"),
    "cold note": ("members_kept_whole", "members_whole", "members",
                  "cold notes say every member whole"),
    "merge": ("facts_kept", "facts_said", "facts",
              "merges state every number, name and date of their members"),
}
HOT_MEMORIES_FEWER = 0.30
HOT_CHARACTERS_FEWER = 0.25
# The categories whose answers must not drop, beside the overall share (issue #37 item 1).
GUARDED_CATEGORIES = ("single-hop", "multi-hop")
SUITE_LIMIT_SECONDS = 30 * 60


def _change(before: int, after: int) -> str:
    return f"{(after - before) / before:+.0%}" if before else "n/a"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _fewer(before: int, after: int, share: float) -> bool:
    return before > 0 and (before - after) / before >= share


def _budgets(data: dict[str, Any]) -> list[int]:
    """The context budgets a locomo run measured: its own, then the shorter ones whose
    shares it reports as ``recall_<budget>_before``."""
    shorter = [int(k.split("_")[1]) for k in data
               if k.startswith("recall_") and k.endswith("_before") and k.count("_") == 2]
    return [int(data["budget"]), *sorted(shorter, reverse=True)]


def _recall_keys(budgets: list[int]) -> list[str]:
    """The overall shares' keys in a locomo JSON, one per budget: the first budget's are
    ``recall_before`` and ``recall_after``, a shorter one's ``recall_<budget>_...``."""
    return ["recall", *(f"recall_{b}" for b in budgets[1:])]


def locomo_targets(data: dict[str, Any], run: Run) -> list[Target]:
    """``bench locomo``'s targets, for the conversations and the summarizer it ran: a run
    on other conversations (held-back ones) is another row, not a newer figure."""
    conversations = data["conversations"]
    names = ", ".join(c["profile"] for c in conversations)
    on = f"{len(conversations)} LoCoMo conversations ({names}), {data['summarizer']} summaries"
    prefix = f"locomo|{data['summarizer']}|{names}"
    out: list[Target] = []

    def add(name: str, target: str, figure: str, verdict: str) -> None:
        out.append(Target(Bench.LOCOMO, f"{prefix}|{name}", f"{target}, on {on}", figure, verdict,
                          run.date, run.commit, run.machine, run.command, run.file))

    budgets = _budgets(data)
    # (who, budget, share before, share after): overall, then each guarded category.
    shares = [("overall", b, data[f"{key}_before"], data[f"{key}_after"])
              for b, key in zip(budgets, _recall_keys(budgets), strict=True)]
    shares += [(c, b, data["categories"][c][f"recall_{b}_before"],
                data["categories"][c][f"recall_{b}_after"])
               for c in GUARDED_CATEGORIES if c in data["categories"] for b in budgets]
    dropped = [f"{who} in {b:,} ({before:.3f} -> {after:.3f})"
               for who, b, before, after in shares if after < before]
    if data["lost"]:
        dropped.append(f"{data['lost']} lost by deep recall")
    by_who: dict[str, list[str]] = {}
    for who, _, before, after in shares:
        by_who.setdefault(who, []).append(f"{before:.3f} -> {after:.3f}")
    figure = (f"in {' and '.join(f'{b:,}' for b in budgets)} characters: "
              + "; ".join(f"{who} {' and '.join(pairs)}" for who, pairs in by_who.items())
              + f"; deep recall {data['deep_recall_before']:.3f} -> "
              f"{data['deep_recall_after']:.3f}, {data['lost']} lost")
    add("no answer lost",
        "no answer lost: answers found in each context budget at or above the unconsolidated "
        f"store, overall and for {' and '.join(GUARDED_CATEGORIES)}; deep recall loses none",
        figure, "met" if not dropped else "missed: " + ", ".join(dropped))

    for name, field, share in (("hot memories", "hot", HOT_MEMORIES_FEWER),
                               ("hot characters", "chars", HOT_CHARACTERS_FEWER)):
        before, after = data[f"{field}_before"], data[f"{field}_after"]
        per = [(c["profile"], c["before"][field], c["after"][field]) for c in conversations]
        figure = (f"{before:,} -> {after:,} ({_change(before, after)}); per conversation "
                  + ", ".join(f"{p} {_change(b, a)}" for p, b, a in per))
        short = [p for p, b, a in per if not _fewer(b, a, share)]
        where = ([] if _fewer(before, after, share) else ["overall"]) + (
            [f"on {', '.join(short)}"] if short else [])
        verdict = "missed " + " and ".join(where) if where else "met"
        add(name, f"{name} >= {share:.0%} fewer, per conversation and overall", figure, verdict)

    for operation, tally in data["fidelity"].items():
        if operation not in FIDELITY_MEASURES or not tally["summaries"]:
            continue
        measure, kept, of, target = FIDELITY_MEASURES[operation]
        figure = (f"{tally[kept]} of {tally[of]} ({_share(tally[measure])}) in "
                  f"{tally['summaries']} summaries; members kept whole "
                  f"{_share(tally['members_kept_whole'])}, facts kept "
                  f"{_share(tally['facts_kept'])}")
        add(f"fidelity|{operation}", f"{target} (100%)", figure,
            "met" if tally[kept] == tally[of] else f"missed: {_share(tally[measure])}")
    return out


def updates_targets(data: dict[str, Any], run: Run) -> list[Target]:
    """``bench updates``' targets: every chain answered with its newest value and no
    summary stating an older one; and nothing else lost on the way."""
    key = f"updates|{data['summarizer']}"
    on = (f"{data['chains']} chains of {len(data['kinds'])} kinds over {data['profiles']} "
          f"profiles, {data['summarizer']} summaries")
    newest_met = data["newest"] == data["chains"] and not data["stale_summaries"]
    kept_met = (data["distractors_found"] == data["distractors"]
                and data["other_facts_found"] == data["other_facts"]
                and data.get("added_values_found") == data.get("added_values"))
    return [
        Target(Bench.UPDATES, f"{key}|newest value",
               "hot recall answers every update chain with its newest value (100%), no "
               f"summary states an older one as current, on {on}",
               f"{data['newest']} of {data['chains']} chains ({data['newest_share']:.1%}; by the "
               f"first hit: {data['top_newest']}); {data['stale_summaries']} stale summaries",
               "met" if newest_met else f"missed: {data['newest_share']:.1%}",
               run.date, run.commit, run.machine, run.command, run.file),
        Target(Bench.UPDATES, f"{key}|nothing else lost",
               "every distractor, every other fact of an updated memory and every value "
               f"added beside another still answered from the hot tier, on {on}",
               f"distractors {data['distractors_found']} of {data['distractors']}"
               + (f" (different things {data['different_things_found']} of "
                  f"{data['different_things']})" if "different_things" in data else "")
               + f", other facts {data['other_facts_found']} of {data['other_facts']}"
               + (f", values added beside another {data['added_values_found']} of "
                  f"{data['added_values']}" if "added_values" in data else ""),
               "met" if kept_met else "missed",
               run.date, run.commit, run.machine, run.command, run.file),
    ]


def _minutes(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def suite_targets(data: dict[str, Any], run: Run) -> list[Target]:
    """The test suite's time: a CI run of ``make test`` from a fresh clone."""
    legs = data["legs"]
    failed = sum(leg.get("failed", 0) for leg in legs)
    figure = (f"{_minutes(data['seconds'])} ({data['seconds']:,} s); "
              + "; ".join(f"{leg['backend']} leg {_minutes(leg['seconds'])}, "
                          f"{leg['passed']:,} passed" for leg in legs)
              + (", side by side" if data.get("side_by_side") else ""))
    over = data["seconds"] - SUITE_LIMIT_SECONDS
    verdict = ("met" if over <= 0 and not failed
               else f"missed: {failed} failed" if failed
               else f"missed by {_minutes(over)}")
    return [Target(Bench.SUITE, "suite|make test",
                   "`make test` from a fresh clone in <= 30 min, both back-ends", figure,
                   verdict, run.date, run.commit, run.machine, run.command, run.file)]


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


def bench_of(data: dict[str, Any]) -> Bench:
    """Which bench wrote a results file, from the shape of its JSON (the local command's
    names itself)."""
    if data.get("bench") == LOCAL_COMMAND:
        return Bench.PLATFORM
    for field, bench in (("results", Bench.SYNTHETIC), ("rows", Bench.API),
                         ("conversations", Bench.LOCOMO), ("chains", Bench.UPDATES),
                         ("legs", Bench.SUITE), ("starts", Bench.START)):
        if field in data:
            return bench
    raise ValueError("not a results file this report knows")


READERS = {
    Bench.SYNTHETIC: synthetic_targets,
    Bench.API: api_targets,
    Bench.LOCOMO: locomo_targets,
    Bench.UPDATES: updates_targets,
    Bench.SUITE: suite_targets,
    Bench.PLATFORM: local_command_targets,
    Bench.START: start_targets,
}


def targets_of(data: dict[str, Any], run: Run | None) -> list[Target]:
    """The targets one results file measures, whatever bench wrote it."""
    if "carried" in data:
        return carried_targets(data)
    if run is None:
        raise ValueError("a bench's JSON needs its date, commit and machine in sources.json")
    return READERS[bench_of(data)](data, run)


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
            # locomo's and updates' JSON do not record their command line: sources.json does.
            run = Run(entry["date"], entry["commit"], entry["machine"],
                      data.get("command") or entry["command"], entry["file"])
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
        lines.append(f"Ingest in the bench's process: {rates['ingest']:,.0f} sentences/s; "
                     f"the raw model {rates['raw_model']:,.0f}.")
        if "wall_ratio" in rates:
            lines.append(
                f"Medians of {rates['runs']} interleaved runs of each, {rates['sentences']:,} "
                f"sentences a run; ingest's rate is {rates['wall_ratio']:.1%} of the model's "
                f"in wall ({rates['wall_ratio_min']:.1%}-{rates['wall_ratio_max']:.1%}), "
                f"{rates['cpu_ratio']:.1%} in CPU ({rates['cpu_ratio_min']:.1%}-"
                f"{rates['cpu_ratio_max']:.1%}); the verdict is on the {rates['judged_on']}.")
        lines.append("")
    if data.get("workers", 1) > 1:
        lines += [f"Server: `reverie api --workers {data['workers']}`; its CPU is every "
                  "process's.", ""]
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


def locomo_table(data: dict[str, Any]) -> list[str]:
    budgets = _budgets(data)
    head = " | ".join(f"{b:,} before | after" for b in budgets)
    lines = [f"Summarizer {data['summarizer']}, {data['as_of_offset_days']:g} days after each "
             "conversation's last session; answers found in each context budget, and by deep "
             "recall (cold tier included).", "",
             f"| conversation | questions | hot before | after | characters before | after | "
             f"{head} | deep found before | after | lost |",
             "|---|" + "---:|" * (8 + 2 * len(budgets))]
    for c in data["conversations"]:
        found = " | ".join(f"{c['before'][f'recall_{b}']:.3f} | {c['after'][f'recall_{b}']:.3f}"
                           for b in budgets)
        lines.append(f"| {c['profile']} | {c['questions']} | {c['before']['hot']:,} | "
                     f"{c['after']['hot']:,} | {c['before']['chars']:,} | "
                     f"{c['after']['chars']:,} | {found} | {c['before']['deep_found']} | "
                     f"{c['after']['deep_found']} | {c['lost']} |")
    found = " | ".join(f"{data[f'{key}_before']:.3f} | {data[f'{key}_after']:.3f}"
                       for key in _recall_keys(budgets))
    deep = [sum(c[side]["deep_found"] for c in data["conversations"])
            for side in ("before", "after")]
    lines.append(f"| total | {data['questions']} | {data['hot_before']:,} | "
                 f"{data['hot_after']:,} | {data['chars_before']:,} | {data['chars_after']:,} | "
                 f"{found} | {deep[0]} | {deep[1]} | {data['lost']} |")
    lines += ["", f"| category | questions | {head} |", "|---|" + "---:|" * (1 + 2 * len(budgets))]
    for name, c in data["categories"].items():
        found = " | ".join(f"{c[f'recall_{b}_before']:.3f} | {c[f'recall_{b}_after']:.3f}"
                           for b in budgets)
        lines.append(f"| {name} | {c['questions']} | {found} |")
    lines += ["", "| operation | summaries | members | kept whole | facts | kept |",
              "|---|---:|---:|---:|---:|---:|"]
    for name, t in data["fidelity"].items():
        lines.append(f"| {name} | {t['summaries']} | {t['members']} | "
                     f"{_share(t['members_kept_whole'])} | {t['facts']} | "
                     f"{_share(t['facts_kept'])} |")
    return lines


def updates_table(data: dict[str, Any]) -> list[str]:
    lines = [f"Summarizer {data['summarizer']}, {data['offset_days']:g} days after the last "
             f"memory, {data['profiles']} profiles; hot memories {data['hot_before']:,} -> "
             f"{data['hot_after']:,}.", "",
             "| kind | chains | newest value answered | joined into one summary |",
             "|---|---:|---:|---:|"]
    for name, k in data["kinds"].items():
        lines.append(f"| {name} | {k['chains']} | {k['newest']} | {k['joined']} |")
    lines.append(f"| total | {data['chains']} | {data['newest']} | {data['joined']} |")
    return lines


def suite_table(data: dict[str, Any]) -> list[str]:
    lines = ["| leg | time | passed | skipped | failed |", "|---|---:|---:|---:|---:|"]
    for leg in data["legs"]:
        lines.append(f"| {leg['backend']} | {_minutes(leg['seconds'])} | {leg['passed']:,} | "
                     f"{leg.get('skipped', 0)} | {leg.get('failed', 0)} |")
    lines.append(f"| whole run | {_minutes(data['seconds'])} | | | |")
    return lines


TABLES = {
    Bench.SYNTHETIC: synthetic_table,
    Bench.API: api_table,
    Bench.LOCOMO: locomo_table,
    Bench.UPDATES: updates_table,
    Bench.SUITE: suite_table,
    Bench.PLATFORM: local_command_table,
    Bench.START: start_table,
}


HEADER = f"""\
# Benchmarks

<!-- Generated by `make docs` (python -m reverie.deployments.docs, which calls
     benchmarks/report.py) from benchmarks/results/*.json: edit those, not this page.
     tests/test_benchmarks_report.py fails when they differ. -->

Every target Reverie holds itself to, with its latest measured figure, the verdict and
the command that measures it again. The figures come from the JSON the benches wrote,
committed in `benchmarks/results/` (`sources.json` gives each run's date, commit and
how busy the machine was); targets no fresh run measured carry their last figure from
the dated rounds, copied by hand once and marked so. Every earlier round, with what was
tried, kept or left out and why, is in [the history]({HISTORY}).

To add a run: run the bench with `--json`, put the file in `benchmarks/results/`, list it
in `sources.json` with its date, commit and machine (and its command, for `bench locomo`
and `bench updates`, whose JSON does not record it), and run `make docs`; a newer
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
  own process, on sentences drawn the same way, and its server's CPU per sentence with
  ingest's. Until 2026-11-27's store-rate2 round each stored sentence also named its
  call, which made it 41% longer in tokens than ingest's: shares before then are lower
  for that reason too.
- **`reverie bench locomo`** (`benchmarks/locomo.py`): answers still found in a 2,000-
  and a 1,000-character context after decay and full consolidation 90 days after each
  LoCoMo conversation's last session, hot memories and characters before and after, and
  what the summaries keep of their members, per operation
  ([docs/quality.md](docs/quality.md)). Rules mode is deterministic: any machine gives
  the same figures.
- **`reverie bench updates`** (`benchmarks/updates.py`): generated update chains of
  several fact kinds; hot recall must answer each with its newest value, and still answer
  the distractors and the other facts of updated memories.
- **`reverie bench embedding`**: OpenVINO against PyTorch on LoCoMo's sentences.
- **The test suite**: `make test` from a fresh clone (`.ci/run`), its two legs side by
  side; the figures are copied from that run's log into a JSON of the same shape each time.
- **Command start-up** (`benchmarks/cli_start.py`): each command as whole processes,
  the typer CLI against e4a754d's argparse CLI taken from git into a scratch folder (its
  moved imports pointed at their new place), same virtualenv and library, in interleaved
  pairs on a scratch copy of the sample store with no Prefect API; the median of the
  pairwise ratios of CPU (user + system) and of wall time, with their range.

## The machine

2 cores of an AMD EPYC (virtual machine), 23.5 GiB memory, no GPU; Linux 6.18, Python
3.11.7, numpy 2.4.6, faiss-cpu 1.15.1, SQLAlchemy 2.0.58, SQLite 3.40.1, the store on
local disk. The synthetic and api JSON record their machine. Other sessions share these
cores: a figure measured on a busy machine says so, and only ratios within one run compare.

The host behind that name is not always the same. The rounds above ran where the model
embedded about 1,490 sentences a second; on 2026-11-29 the host had AVX2 and no AVX-512,
and the same model embedded 296 (`reverie bench api`: server CPU 23 ms per recall, against
7 to 9). Since then the JSON records the CPU's vector extensions
(`machine.vector_extensions`). Compare absolute figures only between runs on hosts with
the same extensions.
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
        lines += TABLES[bench_of(data)](data)
        lines.append("")
    lines.append(METHOD)
    return "\n".join(lines)


def load(results: Path = RESULTS) -> list[Source]:
    sources = json.loads((results / "sources.json").read_text(encoding="utf-8"))
    return [(entry, json.loads((results / entry["file"]).read_text(encoding="utf-8")))
            for entry in sources["runs"]]


def page(results: Path = RESULTS) -> str:
    return render(*plan(load(results)))
