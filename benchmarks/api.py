"""`reverie bench api`: the agent HTTP API measured from outside, as agents use it.

For each size, a store of that many memories per profile is made (the synthetic bench's
stores, vectors supplied: ``benchmarks.synthetic``), ``reverie api`` is started on it as
a real process on a free loopback port, and httpx clients (one thread each, one
connection each) call it: recall (a query the real model embeds in the server, k=5, a
random profile per call) and then store (a batch of new sentences per call, embedded by
the server). Each is run with every number of concurrent clients asked for; the rows
give the latency of one call (p50, p95, as the client sees it: HTTP, JSON, the
operation) and the throughput of all clients together.

The clients are threads on ``http.client`` keep-alive connections (``Connection``), one
each: they share the machine with the server, and httpx's clients took 1.1 ms of CPU per
call to this one's 0.3, CPU the server's latency then waited for. Each row notes the CPU
of both sides per call, and how many cores the load generator took.

Store's sentences per second are compared with ingest's, measured in this process on
the same kind of sentences the synthetic bench ingests (``speed.measure_ingest``:
``models.ingest.ingest`` with the real model, and the raw model alone, in interleaved
runs; the medians). Both sides run with ``REVERIE_EMIT_EVENTS=false``: no Prefect API is
involved.

With ``workers`` above 1 the server is ``reverie api --workers N``: its CPU is that of
the whole process tree (the supervisor and every worker), read before and after a row.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import psutil

from reverie.benchmarks.synthetic import SyntheticSpec, profile_name, records, sentence
from reverie.models.errors import ReverieError
from reverie.models.settings import environment
from reverie.models.store import Store

DEFAULT_SIZES = (1000, 10_000)
DEFAULT_CLIENTS = (1, 8, 32)
DEFAULT_PROFILES = 2
DEFAULT_REQUESTS = 160  # recall calls per row
DEFAULT_STORE_BATCH = 16  # sentences per store call
DEFAULT_STORE_REQUESTS = 64  # store calls per row
# Per run: at about 1,500 sentences/s a run of each side lasts 2-3 s, and with
# speed.DEFAULT_INGEST_RUNS pairs the comparison adds about 15 s to the bench.
DEFAULT_INGEST_SENTENCES = 4096
TOKEN = "bench-api-token-0123456789abcdef"
# Issue #40 item 6.
RECALL_P95_TARGET_MS = 50.0
RECALL_TARGET_AT = (8, 10_000)  # clients, memories per profile
STORE_SHARE_TARGET = 0.80  # of ingest's sentences per second


@dataclass
class ApiRow:
    """One operation at one size and one number of clients."""

    operation: str  # "recall" or "store"
    memories_per_profile: int
    clients: int
    calls: int
    seconds: float
    p50_ms: float
    p95_ms: float
    calls_per_second: float
    sentences_per_second: float | None = None
    errors: int = 0
    # The server's CPU per stored sentence: on a busy machine, where the wall rates
    # follow the load, the ratio to ingest's CPU per sentence still says which does more.
    server_cpu_ms_per_sentence: float | None = None
    target: str = ""
    verdict: str = ""
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ApiBench:
    command: str
    profiles: int
    # speed.ingest_summary: sentences/s of the raw model and of ingest, and their ratios
    ingest: dict[str, Any] = field(default_factory=dict)
    rows: list[ApiRow] = field(default_factory=list)
    workers: int = 1  # server processes of ``reverie api``

    def as_json(self) -> dict[str, Any]:
        from reverie.benchmarks.speed import machine

        return {"command": self.command, "profiles": self.profiles, "workers": self.workers,
                "machine": machine(), "ingest": self.ingest,
                "rows": [r.as_json() for r in self.rows]}


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else 0.0


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _reverie() -> list[str]:
    executable = Path(sys.executable).with_name("reverie")
    if executable.exists():
        return [str(executable)]
    return [sys.executable, "-m", "reverie.deployments.cli"]


def wait_until_healthy(
    process: subprocess.Popen[bytes], url: str, log: Path, seconds: float
) -> None:
    """Wait until the ``reverie api`` ``process`` answers ``url``/health; ReverieError
    with its log if it exits first or does not answer within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        if process.poll() is not None:
            raise ReverieError(f"reverie api exited: {log.read_text(errors='replace')}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise ReverieError(f"reverie api did not answer /health within {seconds:.0f} s: "
                               f"{log.read_text(errors='replace')}")
        time.sleep(0.2)


@dataclass
class Server:
    """A running ``reverie api``: its base URL, and its process (for its CPU time)."""

    url: str
    process: psutil.Process
    workers: int = 1

    def cpu_seconds(self) -> float:
        """CPU of the process and every process under it (``--workers``' server
        processes): the parent's own figure leaves out children that have not exited."""
        return tree_cpu_seconds(self.process)


def tree_cpu_seconds(process: psutil.Process) -> float:
    """User and system CPU seconds of ``process`` and its living descendants."""
    total = 0.0
    try:
        tree = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return total
    for one in tree:
        try:
            times = one.cpu_times()
        except psutil.NoSuchProcess:
            continue  # gone between the listing and the reading: its CPU went with it
        total += float(times.user + times.system)
    return total


@contextmanager
def api_process(database_url: str, folder: Path, workers: int = 1) -> Iterator[Server]:
    """``reverie api --workers workers`` on ``database_url``, on a free loopback port."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("REVERIE_API") and k != "PREFECT_API_URL"}
    env.update({"REVERIE_DATABASE_URL": database_url, "REVERIE_API_ADMIN_TOKEN": TOKEN,
                "REVERIE_EMIT_EVENTS": "false", "PREFECT_HOME": str(folder / "prefect"),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    log = folder / "api.log"
    with log.open("wb") as out:
        process = subprocess.Popen([*_reverie(), "api", "--port", str(port),
                                    "--workers", str(workers)],
                                   stdout=out, stderr=out, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, url, log, 180)
        yield Server(url, psutil.Process(process.pid), workers)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def make_store(url: str, per_profile: int, profiles: int) -> None:
    """``per_profile`` synthetic memories (vectors supplied) in each of ``profiles``."""
    from reverie.engines.embedding import embedder_for
    from reverie.models.ingest import ingest

    made, _ = records(SyntheticSpec(per_profile * profiles, profiles))
    store = Store(url)
    with environment("REVERIE_EMIT_EVENTS", "false"):
        report = ingest(store, made, embedder_for(store.settings))
    if report.errors:
        raise ReverieError(f"the bench store refused {len(report.errors)} records: "
                           f"{report.errors[0].message}")


class Connection:
    """One client's keep-alive HTTP/1.1 connection, with the bench's token: a POST of a
    JSON body gives the status, the whole answer read."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._http = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port,
                                                timeout=300)
        self._headers = {"Authorization": f"Bearer {TOKEN}",
                         "Content-Type": "application/json"}

    def post(self, path: str, data: dict[str, Any]) -> tuple[int, bytes]:
        self._http.request("POST", path, json.dumps(data).encode(), self._headers)
        response = self._http.getresponse()
        return response.status, response.read()

    def close(self) -> None:
        self._http.close()


@dataclass
class Driven:
    latencies: list[float]  # seconds, one per call
    seconds: float  # wall, all calls
    errors: int  # calls that were not a 200
    client_cpu: float  # CPU seconds of this process (the clients) meanwhile
    server_cpu: float  # CPU seconds of the server meanwhile

    def notes(self, calls: int) -> list[str]:
        return [f"server CPU {self.server_cpu / calls * 1000:.1f} ms/call",
                f"clients' CPU {self.client_cpu / calls * 1000:.1f} ms/call "
                f"({self.client_cpu / self.seconds:.2f} cores)"]


def drive(server: Server, clients: int, calls: int,
          request: Callable[[Connection, int], tuple[int, bytes]]) -> Driven:
    """``calls`` calls of ``request`` shared among ``clients`` threads, each with its own
    connection."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    counter = iter(range(calls))
    start = threading.Barrier(clients + 1)

    def client() -> None:
        http = Connection(server.url)
        try:
            start.wait()
            while True:
                with lock:
                    n = next(counter, None)
                if n is None:
                    return
                began = time.perf_counter()
                status, _ = request(http, n)
                took = time.perf_counter() - began
                with lock:
                    latencies.append(took)
                    if status != 200:
                        errors[0] += 1
        finally:
            http.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    began, cpu, served = time.perf_counter(), time.process_time(), server.cpu_seconds()
    for t in threads:
        t.join()
    return Driven(latencies, time.perf_counter() - began, errors[0],
                  time.process_time() - cpu, server.cpu_seconds() - served)


def _queries(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [sentence(int(rng.integers(500)), int(rng.integers(5000)), k, rng)
            for k in range(count)]


def store_texts(clients: Sequence[int], per_profile: int, count: int) -> dict[int, list[str]]:
    """Each store row's sentences: drawn as ingest's are (``speed.bench_ingest_throughput``),
    so that the share compares like with like. A suffix naming the call once made them
    27.3 tokens long against ingest's 19.3, and cost store 0.5 ms more CPU per sentence
    in the model alone. A sentence stored twice would take its vector from the store's
    cache instead of the model, so a repeat within a size is an error, not a rate."""
    texts = {c: _queries(count, seed=1000 + c + per_profile) for c in clients}
    every = [t for row in texts.values() for t in row]
    if len(set(every)) != len(every):
        raise ReverieError("the store rows' sentences repeat: change their seeds")
    return texts


# A worker process that has loaded the model holds well over this (0.6-1.8 GB); the
# supervisor, which only hands out the socket, well under.
LOADED_WORKER_BYTES = 200 * 2**20


def loaded_workers(server: Server) -> int:
    """How many of the server's processes have loaded the model."""
    count = 0
    for child in server.process.children(recursive=True):
        try:
            count += child.memory_info().rss > LOADED_WORKER_BYTES
        except psutil.NoSuchProcess:
            continue
    return count


def warm_every_worker(server: Server, profile: str, seconds: float = 180.0) -> None:
    """Recall on fresh connections, several at once, until every worker has loaded the
    model: the kernel hands each connection to any worker, and a worker's first call
    (its model loaded, seconds of CPU) must not fall inside a measured row."""
    deadline = time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def one() -> None:
        httpx.post(f"{server.url}/v1/profiles/{profile}/recall", headers=headers,
                   json={"query": "warm up", "k": 5}, timeout=300)

    while loaded_workers(server) < server.workers:
        if time.monotonic() > deadline:
            raise ReverieError(f"only {loaded_workers(server)} of {server.workers} server "
                               f"processes loaded the model within {seconds:.0f} s")
        threads = [threading.Thread(target=one, daemon=True) for _ in range(2 * server.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def bench_size(server: Server, per_profile: int, profiles: int, clients: Sequence[int],
               requests: int, store_requests: int, store_batch: int,
               progress: Callable[[ApiRow], None]) -> list[ApiRow]:
    rows: list[ApiRow] = []
    names = [profile_name(p) for p in range(profiles)]
    # Warm: the model loaded in the server, every profile read once.
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"},
                      timeout=300) as http:
        for name in names:
            for _ in range(3):
                r = http.post(f"/v1/profiles/{name}/recall", json={"query": "warm up", "k": 5})
                if r.status_code != 200:
                    raise ReverieError(f"recall answered {r.status_code}: {r.text[:300]}")
    if server.workers > 1:
        warm_every_worker(server, names[0])
    for c in clients:
        queries = _queries(requests, seed=100 + c)

        def recall(http: Connection, n: int, queries: list[str] = queries) -> tuple[int, bytes]:
            return http.post(f"/v1/profiles/{names[n % profiles]}/recall",
                             {"query": queries[n], "k": 5})

        run = drive(server, c, requests, recall)
        row = ApiRow("recall", per_profile, c, requests, round(run.seconds, 3),
                     round(percentile(run.latencies, 50) * 1000, 1),
                     round(percentile(run.latencies, 95) * 1000, 1),
                     round(requests / run.seconds, 1), None, run.errors,
                     notes=run.notes(requests))
        if (c, per_profile) == RECALL_TARGET_AT:
            row.target = f"p95 <= {RECALL_P95_TARGET_MS:g} ms"
            row.verdict = ("met" if row.p95_ms <= RECALL_P95_TARGET_MS
                           else f"missed ({row.p95_ms / RECALL_P95_TARGET_MS:.1f}x)")
        rows.append(row)
        progress(row)
    sentences = store_texts(clients, per_profile, store_requests * store_batch)
    for c in clients:
        texts = sentences[c]

        def store(http: Connection, n: int, texts: list[str] = texts) -> tuple[int, bytes]:
            batch = texts[n * store_batch:(n + 1) * store_batch]
            return http.post(f"/v1/profiles/{names[n % profiles]}/memories",
                             {"memories": [{"content": t} for t in batch]})

        run = drive(server, c, store_requests, store)
        stored = (store_requests - run.errors) * store_batch
        row = ApiRow("store", per_profile, c, store_requests, round(run.seconds, 3),
                     round(percentile(run.latencies, 50) * 1000, 1),
                     round(percentile(run.latencies, 95) * 1000, 1),
                     round(store_requests / run.seconds, 1), round(stored / run.seconds, 1),
                     run.errors,
                     notes=[f"{store_batch} sentences per call", *run.notes(store_requests),
                            f"server CPU {run.server_cpu / max(stored, 1) * 1000:.2f} "
                            "ms/sentence"])
        row.server_cpu_ms_per_sentence = round(run.server_cpu / max(stored, 1) * 1000, 3)
        rows.append(row)
        progress(row)
    return rows


def ingest_rates(sentences: int, folder: Path, runs: int) -> dict[str, Any]:
    """The raw model and ``models.ingest.ingest`` with it (in process), ``runs`` times
    each, interleaved: ``speed.ingest_summary``'s rates, ratios and verdict."""
    from reverie.benchmarks.speed import INGEST_TARGET, Stores, ingest_summary, measure_ingest

    (folder / "ingest").mkdir(exist_ok=True)
    with environment("REVERIE_EMIT_EVENTS", "false"), Stores(folder / "ingest") as stores:
        measured, _ = measure_ingest(sentences, stores, runs)
    rates = ingest_summary(measured)
    share = rates["wall_ratio"]
    rates["target"] = f">= {INGEST_TARGET:.0%} of the raw model's rate"
    rates["verdict"] = "met" if share >= INGEST_TARGET else f"missed: {share:.1%}"
    return rates


def judge_store(bench: ApiBench) -> None:
    ingest = bench.ingest.get("ingest")
    if not ingest:
        return
    for row in bench.rows:
        if row.operation == "store" and row.sentences_per_second is not None:
            share = row.sentences_per_second / ingest
            cpu = bench.ingest.get("ingest_cpu_ms_per_sentence")
            if cpu and row.server_cpu_ms_per_sentence:
                row.notes.append(f"CPU per sentence {row.server_cpu_ms_per_sentence / cpu:.2f}x "
                                 "ingest's")
            row.notes.append(f"{share:.0%} of ingest")
            row.target = f">= {STORE_SHARE_TARGET:.0%} of ingest"
            row.verdict = "met" if share >= STORE_SHARE_TARGET else f"missed ({share:.0%})"


def bench_api(sizes: Sequence[int] = DEFAULT_SIZES, clients: Sequence[int] = DEFAULT_CLIENTS,
              profiles: int = DEFAULT_PROFILES, requests: int = DEFAULT_REQUESTS,
              store_requests: int = DEFAULT_STORE_REQUESTS,
              store_batch: int = DEFAULT_STORE_BATCH,
              ingest_sentences: int = DEFAULT_INGEST_SENTENCES, command: str = "",
              progress: Callable[[ApiRow], None] = lambda _: None, workers: int = 1,
              ingest_runs: int | None = None) -> ApiBench:
    from reverie.benchmarks.speed import DEFAULT_INGEST_RUNS

    bench = ApiBench(command, profiles, workers=workers)
    with tempfile.TemporaryDirectory(prefix="reverie-api-bench-") as name:
        folder = Path(name)
        if ingest_sentences:
            bench.ingest = ingest_rates(ingest_sentences, folder,
                                        ingest_runs or DEFAULT_INGEST_RUNS)
        for size in sizes:
            here = folder / f"n{size}"
            here.mkdir()
            url = f"sqlite:///{here / 'store.db'}"
            make_store(url, size, profiles)
            with api_process(url, here, workers) as server:
                bench.rows += bench_size(server, size, profiles, clients, requests,
                                         store_requests, store_batch, progress)
    judge_store(bench)
    return bench


def render_api(bench: ApiBench) -> str:
    lines = []
    if bench.ingest:
        lines += [ingest_line(bench.ingest), ""]
    if bench.workers > 1:
        lines += [f"server: `reverie api --workers {bench.workers}` (CPU: every process)", ""]
    lines += ["| operation | memories/profile | clients | calls | p50 ms | p95 ms | calls/s "
              "| sentences/s | errors | target | verdict | notes |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in bench.rows:
        rate = "" if r.sentences_per_second is None else f"{r.sentences_per_second:.0f}"
        lines.append(f"| {r.operation} | {r.memories_per_profile:,} | {r.clients} | {r.calls} "
                     f"| {r.p50_ms:.1f} | {r.p95_ms:.1f} | {r.calls_per_second:.1f} | {rate} "
                     f"| {r.errors} | {r.target} | {r.verdict} | {'; '.join(r.notes)} |")
    return "\n".join(lines)



def ingest_line(rates: dict[str, Any]) -> str:
    """Ingest against the raw model, as the bench prints it."""
    from reverie.benchmarks.speed import ingest_ratio_notes

    line = (f"ingest (in process): {rates['ingest']:.0f} sentences/s; "
            f"raw model {rates['raw_model']:.0f} sentences/s")
    if "wall_ratio" not in rates:
        return line
    return f"{line}; {'; '.join(ingest_ratio_notes(rates))}: {rates['verdict']}"
