"""``reverie bench synthetic``: how fast every step and flow is, from 1k to 1M memories.

For each size it generates a synthetic store (``deployments.synthetic``), stores it
through the real ingest path (vectors supplied, so the model is not run), and then:

1. runs every step once, in the order the flows run them, on one copy of the store,
   timing each and reading the process's peak resident memory during it;
2. for dedup and cluster, times the all-pairs search the step makes against a naive
   exact baseline (numpy, block by block over the upper triangle) on the same vectors,
   and reports the recall of the search against that exact answer; above
   ``EXACT_BASELINE_LIMIT`` rows the baseline and recall come from a random sample of
   query rows (the baseline's time scaled to all pairs, marked "estimated"); for
   link_summaries, likewise its nearest-neighbour search against the exact one;
3. runs every flow on a second copy, through Prefect (the ephemeral API, or with
   ``--server`` a real server started for the bench; warmed up first), beside the same
   steps run without Prefect, one profile after another, on a twin copy: the flow's
   time over that work is what Prefect costs. It counts the task runs each flow made.

The stores are SQLite files, or with ``--database-url`` databases on a PostgreSQL
server (copies by ``CREATE DATABASE ... TEMPLATE``), dropped when the bench ends; every
row says which. Separately it measures ingest with embedding against the raw model on
the same sentences. Results are rows of plain data; ``render_markdown`` makes the table
BENCHMARKS.md shows, with each target met or missed by how much.
"""

from __future__ import annotations

import gc
import os
import platform
import re
import shutil
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from reverie.benchmarks.synthetic import SyntheticSpec, records, sentence
from reverie.engines.embedding import embedder_for
from reverie.engines.similarity import chosen_rows
from reverie.flows.catalog import ENTRIES
from reverie.models.config import ConsolidationConfig, SearchConfig
from reverie.models.db import dispose
from reverie.models.ingest import IngestReport, ingest
from reverie.models.repositories.memories import snapshot
from reverie.models.settings import environment, using_database
from reverie.models.store import Store
from reverie.runner.event_delivery import deliver, wanted
from reverie.runner.progress import Bar
from reverie.tasks.step import StepArgs, StepFunction, run_step

# Above this many rows the exact baseline would take too long (quadratic): sample it.
EXACT_BASELINE_LIMIT = 200_000
RECALL_SAMPLE_ROWS = 2_000
BASELINE_BLOCK = 2_048
DEFAULT_INGEST_SENTENCES = 2_048
AS_OF = datetime(2026, 1, 1)


@dataclass
class Result:
    """One measurement: ``task`` on a store of ``n`` memories."""

    task: str
    n: int
    seconds: float
    peak_rss_mb: float | None = None
    baseline_seconds: float | None = None
    recall: float | None = None
    profiles: int = 1
    notes: list[str] = field(default_factory=list)
    target: str | None = None
    verdict: str | None = None
    backend: str = "sqlite"  # where the store was: "sqlite" or "postgresql"
    cpu_seconds: float | None = None  # of every thread of the process, where measured
    # Where the verdict is on a ratio measured otherwise than ``baseline_seconds`` over
    # ``seconds`` (ingest's: the median of interleaved pairs' ratios).
    share: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, [])}


# --- peak memory -------------------------------------------------------------------------

_HWM = re.compile(r"VmHWM:\s+(\d+)\s+kB")
_RSS = re.compile(r"VmRSS:\s+(\d+)\s+kB")


def _status_kb(pattern: re.Pattern[str]) -> float | None:
    try:
        match = pattern.search(Path("/proc/self/status").read_text())
    except OSError:
        return None
    return float(match.group(1)) if match else None


@contextmanager
def peak_rss() -> Iterator[list[float | None]]:
    """The process's peak resident memory (MB) while the block runs, as ``box[0]``.

    Linux lets a process reset its high-water mark (``clear_refs``); where it cannot,
    a thread samples the resident size every 10 ms instead.
    """
    box: list[float | None] = [None]
    try:
        Path("/proc/self/clear_refs").write_text("5")
        resettable = True
    except OSError:
        resettable = False
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.01):
            value = _status_kb(_RSS)
            if value is not None:
                samples.append(value)

    sampler = None if resettable else threading.Thread(target=sample, daemon=True)
    if sampler:
        sampler.start()
    try:
        yield box
    finally:
        if sampler:
            stop.set()
            sampler.join()
            peak = max(samples, default=_status_kb(_RSS))
        else:
            peak = _status_kb(_HWM)
        box[0] = round(peak / 1024, 1) if peak is not None else None


@contextmanager
def measured(task: str, n: int, profiles: int) -> Iterator[Result]:
    """Time the block and its peak memory into a new row."""
    gc.collect()
    row = Result(task, n, 0.0, profiles=profiles)
    with peak_rss() as box:
        started = time.perf_counter()
        yield row
        row.seconds = round(time.perf_counter() - started, 4)
    row.peak_rss_mb = box[0]


# --- search against the exact baseline ---------------------------------------------------


def exact_pairs(vectors: np.ndarray, threshold: float) -> np.ndarray:
    """The naive baseline: every pair i < j at cosine >= threshold, by dense numpy
    products block by block, as sorted keys ``i * n + j``."""
    n = len(vectors)
    bound = np.float32(threshold)
    keys: list[np.ndarray] = []
    for lo in range(0, n, BASELINE_BLOCK):
        hi = min(n, lo + BASELINE_BLOCK)
        sims = vectors[lo:hi] @ vectors[lo:].T
        r, c = np.nonzero(sims >= bound)
        keep = c > r  # the diagonal block holds each pair twice and every row with itself
        keys.append((r[keep] + lo).astype(np.int64) * n + (c[keep] + lo))
    return np.sort(np.concatenate(keys)) if keys else np.zeros(0, np.int64)


def sampled_exact_pairs(
    vectors: np.ndarray, threshold: float, rows: np.ndarray
) -> np.ndarray:
    """Exact pairs at cosine >= threshold that involve one of ``rows``, as keys."""
    n = len(vectors)
    bound = np.float32(threshold)
    keys: list[np.ndarray] = []
    for lo in range(0, len(rows), BASELINE_BLOCK):
        block = rows[lo : lo + BASELINE_BLOCK]
        sims = vectors[block] @ vectors.T
        r, c = np.nonzero(sims >= bound)
        a, b = block[r], c
        keep = a != b
        a, b = a[keep], b[keep]
        keys.append(np.minimum(a, b).astype(np.int64) * n + np.maximum(a, b))
    return np.unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64)


@dataclass(frozen=True, slots=True)
class SearchCheck:
    search_seconds: float
    baseline_seconds: float
    recall: float
    exact_pairs: int
    rows: int
    estimated: bool
    # Linking's check: how many rows asked for their nearest (0: an all-pairs search).
    asked: int = 0

    def describe(self) -> str:
        sampled = " (estimated from a sample)" if self.estimated else ""
        timing = f"search {self.search_seconds:.2f} s vs exact {self.baseline_seconds:.2f} s"
        found = f"{' in the sample' if self.estimated else ''}"
        if self.asked:
            return (f"{timing}{sampled} for {self.asked:,} summaries among {self.rows:,} "
                    f"memories; {self.exact_pairs:,} exact links{found}")
        return (f"{timing}{sampled} on {self.rows:,} candidates; "
                f"{self.exact_pairs:,} exact pairs{found}")


def check_search(vectors: np.ndarray, threshold: float, seed: int = 0,
                 search: SearchConfig | None = None) -> SearchCheck:
    """Time Reverie's all-pairs search (as ``search`` says, else by default) and the
    exact baseline on ``vectors``; the recall of the search against the exact answer
    (sampled above ``EXACT_BASELINE_LIMIT``)."""
    from reverie.engines.similarity import similarity_pairs

    n = len(vectors)
    started = time.perf_counter()
    i, j, _ = similarity_pairs(vectors, threshold, search or SearchConfig())
    search_seconds = time.perf_counter() - started
    found = i.astype(np.int64) * n + j
    if n <= EXACT_BASELINE_LIMIT:
        started = time.perf_counter()
        exact = exact_pairs(vectors, threshold)
        baseline = time.perf_counter() - started
        estimated = False
    else:
        rows = np.sort(np.random.default_rng(seed).choice(n, RECALL_SAMPLE_ROWS, replace=False))
        started = time.perf_counter()
        exact = sampled_exact_pairs(vectors, threshold, rows)
        # The sample computed len(rows) * n products; all pairs take n * n / 2.
        baseline = (time.perf_counter() - started) * n / (2 * len(rows))
        estimated = True
    recall = float(np.isin(exact, found).mean()) if len(exact) else 1.0
    return SearchCheck(round(search_seconds, 4), round(baseline, 4), round(recall, 5),
                       len(exact), n, estimated)


def check_links(vectors: np.ndarray, rows: Sequence[int], config: ConsolidationConfig,
                seed: int = 0) -> SearchCheck:
    """Time linking's search for the nearest of ``rows`` (as the step makes it) and the
    exact one; the recall of its links against the exact links (for a sample
    of ``rows`` above ``EXACT_BASELINE_LIMIT`` memories)."""
    from reverie.engines.similarity import nearest_within

    link = config.linking
    started = time.perf_counter()
    found = nearest_within(vectors, rows, link.similarity, link.max_links,
                           config.search.with_probes(link.cell_probes))
    search_seconds = time.perf_counter() - started
    asked = np.asarray(rows, dtype=np.int64)
    positions = np.arange(len(asked))
    estimated = len(vectors) > EXACT_BASELINE_LIMIT and len(asked) > RECALL_SAMPLE_ROWS
    if estimated:
        positions = np.sort(np.random.default_rng(seed).choice(
            len(asked), RECALL_SAMPLE_ROWS, replace=False))
    started = time.perf_counter()
    exact = nearest_within(vectors, asked[positions], link.similarity, link.max_links,
                           SearchConfig(exact_limit=100_000_000))
    baseline = (time.perf_counter() - started) * len(asked) / max(1, len(positions))
    exact_links = {(int(p), int(j)) for p, idx in zip(positions, exact.indices, strict=True)
                   for j in idx}
    links = {(int(p), int(j)) for p in positions for j in found.indices[p]}
    recall = len(exact_links & links) / len(exact_links) if exact_links else 1.0
    return SearchCheck(round(search_seconds, 4), round(baseline, 4), round(recall, 5),
                       len(exact_links), len(vectors), estimated, asked=len(asked))


def _candidate_vectors(store: Store, profile: str, keep: Callable[[Any], bool]) -> np.ndarray:
    with store.reading(profile) as tx:
        return chosen_rows(*snapshot(tx), keep)[1]


# --- steps and flows ---------------------------------------------------------------------


def steps() -> list[tuple[str, StepFunction]]:
    """Every step, in the order the flows run them (so each finds its inputs)."""
    from reverie.tasks.blocks import compile_blocks
    from reverie.tasks.cluster import cluster
    from reverie.tasks.cold_notes import consolidate_cold, mark_stalled
    from reverie.tasks.cold_tier import expire_cold_unapproved, migrate_cold
    from reverie.tasks.compress import compress_fading
    from reverie.tasks.creative import creative
    from reverie.tasks.decay import decay
    from reverie.tasks.dedup import dedup, dedup_new_summaries
    from reverie.tasks.edge_decay import decay_edges
    from reverie.tasks.forget import forget
    from reverie.tasks.importance import graph_importance
    from reverie.tasks.linking import link_summaries
    from reverie.tasks.promote import promote

    return [
        ("decay", decay), ("dedup", dedup), ("compress_fading", compress_fading),
        ("dedup_new_summaries", dedup_new_summaries), ("decay_edges", decay_edges),
        ("promote", promote), ("compile_blocks", compile_blocks),
        ("link_summaries", link_summaries), ("graph_importance", graph_importance),
        ("creative", creative), ("cluster", cluster), ("consolidate_cold", consolidate_cold),
        ("forget", forget), ("mark_stalled", mark_stalled), ("migrate_cold", migrate_cold),
        ("expire_cold", expire_cold_unapproved),
    ]


# Flows in the order a day's schedules would first run them, and the steps each runs in
# an order its DAG allows: its work without Prefect, timed one profile after another on
# a twin copy of the store (tests/test_speed_bench.py holds this against the flows' own
# reports). Both from the registry of flows.
FLOW_ORDER = tuple(ENTRIES)
FLOW_STEPS: dict[str, tuple[str, ...]] = {e.name: e.steps for e in ENTRIES.values()}


def bench_config() -> ConsolidationConfig:
    """Defaults, with rules summaries (no LLM) and forgetting switched on, so that
    forget has work: an operator who enables it archives below relevance 0.1."""
    base = ConsolidationConfig()
    return base.model_copy(update={
        "summarizer": "rules",
        "forget": base.forget.model_copy(update={"archive_threshold": 0.1}),
    })


def _search_check(
    store: Store, profile: str, step: str, config: ConsolidationConfig
) -> SearchCheck:
    from reverie.tasks import cluster, dedup, linking

    search = config.search
    if step == "link_summaries":
        with store.reading(profile) as tx:
            memories, vectors = snapshot(tx)
        return check_links(vectors, linking.link_rows(memories), config)
    if step == "dedup":
        vectors = _candidate_vectors(store, profile, lambda m: dedup.is_candidate(m, AS_OF))
        threshold = config.dedup.similarity
    else:
        vectors = _candidate_vectors(
            store, profile, lambda m: cluster.is_candidate(m, config.cluster)
        )
        threshold = config.cluster.similarity
        search = search.with_probes(config.cluster.cell_probes)
    return check_search(vectors, threshold, search=search)


def bench_search(vectors: np.ndarray, config: ConsolidationConfig) -> list[Result]:
    """The all-pairs search over every memory at the cluster threshold: the steps see
    only their candidates (cluster: relevance above 0.3), this is the search at full
    size, where the most pairs sit near the threshold."""
    with measured("pair search, all memories", len(vectors), 1) as row:
        check = check_search(vectors, config.cluster.similarity, search=config.search)
    row.seconds = check.search_seconds
    row.baseline_seconds, row.recall = check.baseline_seconds, check.recall
    row.notes.append(f"at cosine >= {config.cluster.similarity}; {check.describe()}")
    return [row]


# The steps whose search is timed against the exact one, with its recall.
CHECKED_STEPS = ("dedup", "link_summaries", "cluster")


def bench_steps(url: str, spec: SyntheticSpec, config: ConsolidationConfig,
                checks: bool) -> Iterator[Result]:
    """One row per step, each given as soon as it is measured."""
    store = Store(url)
    profiles = store.profiles()
    for name, fn in steps():
        check = None
        if checks and name in CHECKED_STEPS and len(profiles) == 1:
            # On the very candidates the step is about to search.
            check = _search_check(store, profiles[0], name, config)
        reports = []
        with measured(name, spec.memories, len(profiles)) as row:
            for profile in profiles:
                reports.append(run_step(name, fn, StepArgs(url, profile, AS_OF, config)))
        row.notes.append(f"{sum(r.changed for r in reports)} changes")
        embedding = sum(r.embedding_seconds for r in reports)
        if embedding:
            row.notes.append(f"embedding new summaries {embedding:.2f} s")
        if check:
            row.baseline_seconds, row.recall = check.baseline_seconds, check.recall
            row.notes.append(check.describe())
        yield row


def warm_up_prefect(stores: Stores) -> None:
    """Start Prefect's ephemeral API before anything is timed (6-11 s, once)."""
    from reverie.flows.lightweight_consolidation import lightweight_consolidation

    url = stores.new("warm_up")
    spec = SyntheticSpec(20)
    _ingest(Store(url), records(spec)[0])
    with using_database(url):
        lightweight_consolidation(profile=None, as_of=AS_OF, config=bench_config())
    stores.drop(url)


def run_plain(flow: str, url: str, config: ConsolidationConfig) -> float:
    """Run ``flow``'s steps without Prefect, one profile after another; the seconds."""
    functions = dict(steps())
    started = time.perf_counter()
    for profile in Store(url).profiles():
        for name in FLOW_STEPS[flow]:
            run_step(name, functions[name], StepArgs(url, profile, AS_OF, config))
    return time.perf_counter() - started


def bench_flows(url: str, twin: str, spec: SyntheticSpec, config: ConsolidationConfig,
                names: Sequence[str] = FLOW_ORDER) -> Iterator[Result]:
    """One row per flow, each as soon as measured: the flow through Prefect on ``url``,
    beside the same steps without Prefect on ``twin`` (an identical copy; both copies
    go through the flows in the same order, so each flow finds the same store)."""
    from reverie.flows.catalog import FLOWS
    from reverie.runner.runtime import without_heartbeats

    for name in (n for n in FLOW_ORDER if n in names):
        work = None
        if name in FLOW_STEPS:
            with using_database(twin):
                work = run_plain(name, twin, config)
        # Without heartbeats, as a local command runs its flows: the bench's server is
        # its own too, and ending a heartbeat added 0-1 s to every flow row.
        with using_database(url), without_heartbeats(), measured(
            f"flow {FLOWS[name].name}", spec.memories, spec.profiles
        ) as row:
            report = FLOWS[name](profile=None, as_of=AS_OF, config=config)
        embedding = sum(s.embedding_seconds for s in report.steps)
        tasks = task_runs(report.run_id)
        if work is not None:
            row.baseline_seconds = round(work, 4)
            row.notes.append(f"{row.seconds / work:.2f}x the steps' own work "
                             f"({work:.3f} s without Prefect)")
        row.notes.append(f"{tasks} task runs" if tasks is not None else "task runs not counted")
        row.notes.append(f"embedding new summaries {embedding:.3f} s; "
                         f"{report.changed()} changes")
        yield row


def task_runs(run_id: str | None, settle_seconds: float = 60.0) -> int | None:
    """How many task runs Prefect recorded for the flow run (they arrive as events:
    counted until the number stops growing)."""
    if run_id is None:
        return None
    from prefect.client.orchestration import get_client

    from reverie.runner.runtime import recorded_task_runs, wait_for_run_history

    wait_for_run_history(run_id)
    seen, deadline = -1, time.monotonic() + settle_seconds
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            count = len(recorded_task_runs(client, run_id))
            if count == seen and count > 0:
                return count
            seen = count
            time.sleep(1.0)
    return seen


def server_health(log: Path) -> Result:
    """What the server's log says went wrong under the bench's load."""
    text = log.read_text(errors="replace") if log.exists() else ""
    locked = text.count("database is locked")
    statuses = re.findall(r'HTTP/1\.[01]" (\d{3})', text)
    errors = sum(status.startswith("5") for status in statuses)
    tracebacks = text.count("Traceback")
    return Result("prefect server health", 0, 0.0, notes=[
        f"{len(statuses)} requests, {errors} answered 5xx; 'database is locked' "
        f"{locked} time(s); tracebacks {tracebacks}"])


def _ingest(store: Store, made: list[dict[str, Any]]) -> IngestReport:
    """Ingest as the CLI does: the configured model, and events delivered if wanted."""
    embedder = embedder_for(store.settings)
    report = ingest(store, made, embedder,
                    queue_events=wanted())
    if report.queued_events:
        deliver(store.url)
    return report


# Interleaved pairs of runs: one run of each lasts a second or two, inside the noise of
# a shared machine (the 90% target read 89-93% from one round to the next, the code
# unchanged), so each side runs several times, alternating, and the verdict is the
# median of the pairs' ratios.
DEFAULT_INGEST_RUNS = 3


@dataclass(frozen=True)
class IngestRuns:
    """Interleaved runs of the raw model and of ingest on the same sentences: each
    list holds one figure per run, in seconds (wall, or CPU of every thread)."""

    sentences: int
    raw_wall: tuple[float, ...]
    raw_cpu: tuple[float, ...]
    ingest_wall: tuple[float, ...]
    ingest_cpu: tuple[float, ...]


def _median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=np.float64)))


def ingest_summary(runs: IngestRuns) -> dict[str, Any]:
    """The runs summarised: medians of each side's rates and CPU per sentence, and of
    each pair's ratio (raw seconds over ingest's: ingest's rate as a share of the
    model's), with their min and max; ``judged_on`` names the ratio the verdict uses.
    A pair is one run of each side, next to each other, so both saw the same load."""
    n = runs.sentences
    wall = [r / i for r, i in zip(runs.raw_wall, runs.ingest_wall, strict=True)]
    cpu = [r / i for r, i in zip(runs.raw_cpu, runs.ingest_cpu, strict=True)]
    return {
        "raw_model": round(n / _median(runs.raw_wall), 1),
        "ingest": round(n / _median(runs.ingest_wall), 1),
        "raw_cpu_ms_per_sentence": round(_median(runs.raw_cpu) / n * 1000, 3),
        "ingest_cpu_ms_per_sentence": round(_median(runs.ingest_cpu) / n * 1000, 3),
        "sentences": n,
        "runs": len(wall),
        "wall_ratio": round(_median(wall), 4),
        "wall_ratio_min": round(min(wall), 4),
        "wall_ratio_max": round(max(wall), 4),
        "cpu_ratio": round(_median(cpu), 4),
        "cpu_ratio_min": round(min(cpu), 4),
        "cpu_ratio_max": round(max(cpu), 4),
        "judged_on": INGEST_JUDGED_ON,
    }


def ingest_ratio_notes(summary: Mapping[str, Any]) -> list[str]:
    """The ratios as a row's notes say them."""
    return [f"{summary['wall_ratio']:.1%} of the raw model's rate, median of "
            f"{summary['runs']} interleaved pairs of {summary['sentences']:,} sentences "
            f"({summary['wall_ratio_min']:.1%}-{summary['wall_ratio_max']:.1%})",
            f"in CPU {summary['cpu_ratio']:.1%} ({summary['cpu_ratio_min']:.1%}-"
            f"{summary['cpu_ratio_max']:.1%}); {summary['ingest_cpu_ms_per_sentence']:.3f} "
            f"against {summary['raw_cpu_ms_per_sentence']:.3f} ms CPU per sentence",
            f"verdict on the {summary['judged_on']}"]


def measure_ingest(sentences: int, stores: Stores, runs: int = DEFAULT_INGEST_RUNS
                   ) -> tuple[IngestRuns, list[Result]]:
    """Ingest with embedding against the raw model on the same sentences, ``runs``
    times each, alternating (model, ingest, model, ingest, ...); each ingest into a
    store of its own, so that none finds the sentences already stored. The rows carry
    the medians."""
    from reverie.engines.embedding import get_embedder

    rng = np.random.default_rng(11)
    texts = [sentence(int(rng.integers(500)), int(rng.integers(5000)), k, rng)
             for k in range(sentences)]
    embedder = get_embedder()
    embedder.encode(texts[:64])  # load the model and warm it before either is timed
    raw_rows: list[Result] = []
    rows: list[Result] = []
    raw_cpu: list[float] = []
    ingest_cpu: list[float] = []
    for k in range(runs):
        cpu = time.process_time()
        with measured("embed (raw model)", sentences, 1) as raw:
            embedder.encode(texts)
        raw_cpu.append(time.process_time() - cpu)
        raw_rows.append(raw)
        url = stores.new(f"ingest{k}")
        cpu = time.process_time()
        with measured("ingest + embed", sentences, 1) as row:
            report = _ingest(Store(url), [{"content": t, "profile": "ingest"} for t in texts])
        ingest_cpu.append(time.process_time() - cpu)
        stores.drop(url)
        if report.stored != sentences:
            raise RuntimeError(f"ingest stored {report.stored} of {sentences} sentences")
        rows.append(row)
    measured_runs = IngestRuns(sentences, tuple(r.seconds for r in raw_rows), tuple(raw_cpu),
                               tuple(r.seconds for r in rows), tuple(ingest_cpu))
    summary = ingest_summary(measured_runs)
    raw = Result("embed (raw model)", sentences, round(_median(measured_runs.raw_wall), 4),
                 peak_rss_mb=_peak(raw_rows), profiles=1,
                 cpu_seconds=round(_median(raw_cpu), 4),
                 notes=[f"{summary['raw_model']:.0f} sentences/s (median of {runs} runs)"])
    row = Result("ingest + embed", sentences, round(_median(measured_runs.ingest_wall), 4),
                 peak_rss_mb=_peak(rows), profiles=1, baseline_seconds=raw.seconds,
                 cpu_seconds=round(_median(ingest_cpu), 4), share=summary["wall_ratio"],
                 notes=[f"{summary['ingest']:.0f} sentences/s (median of {runs} runs)",
                        *ingest_ratio_notes(summary)])
    return measured_runs, [raw, row]


def _peak(rows: Sequence[Result]) -> float | None:
    peaks = [r.peak_rss_mb for r in rows if r.peak_rss_mb is not None]
    return max(peaks) if peaks else None


def bench_ingest_throughput(sentences: int, stores: Stores, runs: int = DEFAULT_INGEST_RUNS
                            ) -> list[Result]:
    """Ingest with embedding against the raw model on the same sentences (the rows of
    ``measure_ingest``)."""
    return measure_ingest(sentences, stores, runs)[1]


# --- where the stores live --------------------------------------------------------------


class Stores:
    """The bench's stores: SQLite files in ``folder``, or with ``server`` (a PostgreSQL
    URL whose role may CREATE DATABASE) one database each on that server, named
    ``reverie_bench_<run>_<name>``. A copy of a PostgreSQL store is ``CREATE DATABASE
    ... TEMPLATE``, which wants no other connection to the source: its engine is
    disposed first. ``drop`` removes one store; leaving the ``with`` block removes
    every store still there, whether the bench finished or failed."""

    def __init__(self, folder: Path, server: str | None = None) -> None:
        self.folder = folder
        self.server = server
        self.backend = "postgresql" if server else "sqlite"
        self.run = uuid.uuid4().hex[:6]  # two benches on one server keep apart
        self.made: list[str] = []

    def __enter__(self) -> Stores:
        return self

    def __exit__(self, *_: object) -> None:
        for url in list(self.made):
            self.drop(url)

    def _admin(self, statement: str) -> None:
        from sqlalchemy import create_engine, text

        assert self.server is not None  # only stores on a server have an admin
        admin = create_engine(self.server, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(statement))
        finally:
            admin.dispose()

    def _url(self, name: str) -> str:
        if not self.server:
            return f"sqlite:///{self.folder / name}.db"
        from sqlalchemy.engine import make_url

        database = f"reverie_bench_{self.run}_{name}"
        return make_url(self.server).set(database=database).render_as_string(
            hide_password=False)

    @staticmethod
    def _database(url: str) -> str:
        from sqlalchemy.engine import make_url

        return str(make_url(url).database)

    def new(self, name: str) -> str:
        """An empty store's URL (the schema comes with its first engine)."""
        url = self._url(name)
        if self.server:
            # C collation: the database orders text as SQLite does (as the tests' do).
            self._admin(f"CREATE DATABASE {self._database(url)} TEMPLATE template0 "
                        "ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'")
        self.made.append(url)
        return url

    def copy(self, source: str, name: str) -> str:
        """A copy of the store at ``source``, as it is now."""
        dispose(source)  # SQLite: every write in the file; PostgreSQL: no one connected
        url = self._url(name)
        if self.server:
            self._admin(f"CREATE DATABASE {self._database(url)} "
                        f"TEMPLATE {self._database(source)}")
        else:
            shutil.copyfile(self._database(source), self._database(url))
        self.made.append(url)
        return url

    def drop(self, url: str) -> None:
        # Engines are cached by URL: let go of the store before it goes.
        dispose(url)
        if self.server:
            self._admin(f"DROP DATABASE IF EXISTS {self._database(url)} WITH (FORCE)")
        else:
            Path(self._database(url)).unlink(missing_ok=True)
        self.made.remove(url)


def backend(database_url: str | None) -> dict[str, Any]:
    """Where the stores are, for the JSON's machine section: SQLite, or the PostgreSQL
    server's version and URL (password masked)."""
    if not database_url:
        return {"backend": "sqlite"}
    from sqlalchemy import create_engine, text

    from reverie.models.settings import display_url

    admin = create_engine(database_url)
    try:
        with admin.connect() as conn:
            version = conn.execute(text("SHOW server_version")).scalar()
    finally:
        admin.dispose()
    return {"backend": "postgresql", "postgresql": version,
            "database_server": display_url(database_url)}


# --- one size, then all ------------------------------------------------------------------


def bench_size(spec: SyntheticSpec, stores: Stores, config: ConsolidationConfig,
               flows: bool, checks: bool, step_rows: bool = True,
               flow_names: Sequence[str] = FLOW_ORDER) -> Iterator[Result]:
    """Every row for one store size, each given as soon as it is measured (a 1M run
    takes an hour: what is done survives an interruption)."""
    n = spec.memories
    url = stores.new(f"{n}_store")
    made, vectors = records(spec)
    # Events off: with --server every store would notify the server, which is the
    # triggers' business, not what this measures.
    with measured("ingest (vectors supplied)", spec.memories, spec.profiles) as row, \
            environment("REVERIE_EMIT_EVENTS", "false"):
        report = _ingest(Store(url), made)
    row.notes.append(f"{report.stored} memories, {report.edges} edges")
    yield row
    del made
    if checks and vectors is not None:
        yield from bench_search(vectors, config)
    del vectors
    copies = [stores.copy(url, f"{n}_steps")]
    if step_rows:
        yield from bench_steps(copies[0], spec, config, checks)
        copies.append(stores.copy(url, f"{n}_plain"))
    if flows:
        copies.append(stores.copy(url, f"{n}_flows"))
        yield from bench_flows(copies[-1], copies[-2], spec, config, flow_names)
    for done in (url, *copies):
        stores.drop(done)


def bench_synthetic(
    sizes: Sequence[int],
    profiles: int = 1,
    duplicate_share: float = 0.10,
    embeddings: str = "random",
    flows: bool = True,
    checks: bool = True,
    ingest_sentences: int = DEFAULT_INGEST_SENTENCES,
    progress: Callable[[Result], None] | None = None,
    server: Callable[[Path], AbstractContextManager[Path]] | None = None,
    step_rows: bool = True,
    flow_names: Sequence[str] = FLOW_ORDER,
    database_url: str | None = None,
) -> list[Result]:
    """Every measurement for every size, each row judged against its target. The
    stores are SQLite files, or with ``database_url`` (a PostgreSQL server URL whose
    role may CREATE DATABASE) databases on that server, dropped at the end. With
    ``server`` (given a folder, it starts a real Prefect server there and yields its
    log: the CLI passes ``deployments.serve.loopback_server``) the flows go through it. On a
    terminal a bar on stderr counts the rows; ``progress`` (which may print) is called
    with the bar cleared."""
    config = bench_config()
    results: list[Result] = []
    total = expected_rows(sizes, embeddings, flows, checks, ingest_sentences, server is not None,
                          step_rows, flow_names)

    def keep(rows: Iterable[Result]) -> None:
        for row in rows:
            row.backend = stores.backend
            judge(row)
            results.append(row)
            bar.update()
            bar.describe(f"done {row.task} (n={row.n:,})")
            if progress:
                with bar.paused():
                    progress(row)

    with tempfile.TemporaryDirectory(prefix="reverie-bench-") as name, ExitStack() as stack:
        bar = stack.enter_context(Bar(total, "bench", unit="row"))
        folder = Path(name)
        stores = stack.enter_context(Stores(folder, database_url))
        log = stack.enter_context(server(folder)) if flows and server else None
        bar.describe("loading the model")
        if ingest_sentences:
            keep(bench_ingest_throughput(ingest_sentences, stores))
        else:
            from reverie.engines.embedding import get_embedder

            # Steps embed the summaries they word afresh: load the model before timing.
            get_embedder().encode(["warm up"])
        if flows:
            bar.describe("starting Prefect")
            warm_up_prefect(stores)
        for n in sizes:
            # The command's choices hold embeddings to the Literal's values.
            spec = SyntheticSpec(n, profiles, duplicate_share, embeddings, as_of=AS_OF)  # type: ignore[arg-type]
            keep(bench_size(spec, stores, config, flows, checks, step_rows, flow_names))
        if log is not None:
            keep([server_health(log)])
    return results


def expected_rows(
    sizes: Sequence[int],
    embeddings: str = "random",
    flows: bool = True,
    checks: bool = True,
    ingest_sentences: int = DEFAULT_INGEST_SENTENCES,
    server: bool = False,
    step_rows: bool = True,
    flow_names: Sequence[str] = FLOW_ORDER,
) -> int:
    """How many rows ``bench_synthetic`` gives for these arguments: its bar's total."""
    per_size = (
        1  # ingest
        + (1 if checks and embeddings == "random" else 0)  # the search at full size
        + (len(steps()) if step_rows else 0)
        + (sum(1 for n in FLOW_ORDER if n in flow_names) if flows else 0)
    )
    ingest = 2 if ingest_sentences else 0  # the raw model, and ingest with it
    health = 1 if flows and server else 0  # the server's log, read at the end
    return ingest + per_size * len(sizes) + health


# --- targets -----------------------------------------------------------------------------

# (task, n) -> most seconds allowed, on two cores with the memories already embedded.
TIME_TARGETS: dict[tuple[str, int], float] = {
    ("decay", 100_000): 1.0,
    ("dedup", 100_000): 10.0,
    ("cluster", 100_000): 10.0,
    ("pair search, all memories", 100_000): 10.0,
    ("flow full-consolidation", 100_000): 60.0,
    ("lightweight work", 10_000): 0.1,
}
RECALL_TARGET = 0.99
# Tasks whose recall is judged though the issue sets them no time: linking's search
# goes by cells above the exact limit, as dedup's and cluster's do.
RECALL_ONLY = frozenset({"link_summaries"})
INGEST_TARGET = 0.90
# Ingest's target is a rate: judged in wall time, the CPU ratio said beside it.
INGEST_JUDGED_ON = "median wall ratio"
EVERY_TASK_AT = 1_000_000


def judge(row: Result) -> None:
    """Set the row's target and verdict, where the issue sets one."""
    verdicts: list[str] = []
    targets: list[str] = []
    limit = TIME_TARGETS.get((row.task, row.n)) if row.profiles == 1 else None
    if limit is not None:
        targets.append(f"<= {limit:g} s")
        verdicts.append("met" if row.seconds <= limit else
                        f"missed by {row.seconds - limit:.2f} s ({row.seconds / limit:.1f}x)")
    if row.recall is not None and (limit is not None or row.task in RECALL_ONLY):
        targets.append(f"recall >= {RECALL_TARGET}")
        verdicts.append("met" if row.recall >= RECALL_TARGET else
                        f"recall missed by {RECALL_TARGET - row.recall:.4f}")
    if row.task == "ingest + embed" and row.baseline_seconds:
        share = row.share if row.share is not None else row.baseline_seconds / row.seconds
        targets.append(f">= {INGEST_TARGET:.0%} of raw model")
        verdicts.append("met" if share >= INGEST_TARGET else
                        f"missed: {share:.1%} of raw model")
    if row.n >= EVERY_TASK_AT and not targets:
        targets.append("completes")
        verdicts.append("met")
    if targets:
        row.target = "; ".join(targets)
        row.verdict = "; ".join(verdicts)


# --- report ------------------------------------------------------------------------------


VECTOR_EXTENSIONS = frozenset({"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16",
                               "amx_bf16", "amx_int8", "amx_tile"})


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import faiss
    import sqlalchemy

    cpu, flags = "", set()
    try:
        info = Path("/proc/cpuinfo").read_text()
        found = re.search(r"model name\s*:\s*(.+)", info)
        cpu = found.group(1).strip() if found else ""
        found = re.search(r"flags\s*:\s*(.+)", info)
        flags = set(found.group(1).split()) if found else set()
    except OSError:
        pass
    memory_kb = None
    try:
        found = re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())
        memory_kb = int(found.group(1)) if found else None
    except OSError:
        pass
    return {
        "cpu": cpu or platform.processor(),
        "cores": os.cpu_count(),
        # The model's speed hangs on these more than on the CPU's name: one "AMD EPYC"
        # host with AVX-512 ran it 5x as fast as another with AVX2 alone.
        "vector_extensions": sorted(flags & VECTOR_EXTENSIONS),
        "memory_gb": round(memory_kb / 1024**2, 1) if memory_kb else None,
        "system": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "faiss": faiss.__version__,
        "sqlalchemy": sqlalchemy.__version__,
        "sqlite": sqlite3.sqlite_version,
    }


def _cell(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


STORE_TITLES = {
    "sqlite": "Stores: SQLite files.",
    "postgresql": "Stores: PostgreSQL databases (peak RSS is the bench's own process; "
                  "the server's memory is not in it).",
}


def render_markdown(results: Sequence[Result]) -> str:
    backends = dict.fromkeys(r.backend for r in results) or ["sqlite"]
    lines = [
        *(STORE_TITLES[b] for b in backends),
        "",
        "| task | n | profiles | seconds | peak RSS MB | baseline s | speed-up | recall "
        "| target | verdict | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for r in results:
        speedup = (f"{r.baseline_seconds / r.seconds:.1f}x"
                   if r.baseline_seconds and r.seconds else "")
        lines.append(
            f"| {r.task} | {r.n:,} | {r.profiles} | {_cell(r.seconds)} | "
            f"{_cell(r.peak_rss_mb, 0)} | {_cell(r.baseline_seconds, 2)} | {speedup} | "
            f"{_cell(r.recall, 4)} | {r.target or ''} | {r.verdict or ''} | "
            f"{'; '.join(r.notes)} |"
        )
    return "\n".join(lines)


def as_json(results: Sequence[Result], command: str,
            stores: dict[str, Any] | None = None) -> dict[str, Any]:
    """The rows, the command and the machine; ``stores`` (``backend``'s answer) joins
    the machine section, SQLite when not given."""
    return {
        "command": command,
        "machine": {**machine(), **(stores or backend(None))},
        "results": [r.as_json() for r in results],
    }
