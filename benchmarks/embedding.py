"""`reverie bench embedding`: OpenVINO against PyTorch, in one process on the same texts.

Each workload is encoded by both backends after both are loaded and warmed, so the
ratio holds on a busy machine too: short synthetic sentences (what the synthetic bench
ingests), LoCoMo turns and facts (real conversation), and 5-memory summaries (what
compression embeds afresh, worded as the rules summarizer words them). Ingest is timed
through ``models.ingest.ingest`` on each backend. With a LoCoMo file, every one of its sentences
is compared: the smallest cosine between the two backends' vectors is reported.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reverie.benchmarks.synthetic import sentence
from reverie.engines.embedding import Embedder, get_embedder
from reverie.models.errors import EmbeddingError
from reverie.models.ingest import ingest
from reverie.models.settings import EmbeddingBackend, environment
from reverie.models.store import Store

SUMMARY_MEMBERS = 5
# Issue #20: ingest with embedding at this rate or faster on the OpenVINO backend.
INGEST_TARGET = 600.0


@dataclass
class EmbeddingRow:
    """One workload on both backends: seconds, throughput, and how close the vectors are."""

    workload: str
    n: int
    torch_seconds: float
    openvino_seconds: float
    min_cosine: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.torch_seconds / self.openvino_seconds if self.openvino_seconds else 0.0

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "speedup": round(self.speedup, 2)}


def short_sentences(count: int, seed: int = 11) -> list[str]:
    rng = np.random.default_rng(seed)
    return [sentence(int(rng.integers(500)), int(rng.integers(5000)), k, rng)
            for k in range(count)]


def summaries(members: list[str], size: int = SUMMARY_MEMBERS) -> list[str]:
    """Consecutive ``size`` members worded as compression's rules wording does."""
    return ["Summary: " + " | ".join(members[i : i + size])
            for i in range(0, len(members) - size + 1, size)]


def locomo_texts(path: Path) -> tuple[list[str], list[str]]:
    """(turns, every sentence: turns, observed facts, questions) of a LoCoMo file."""
    turns: list[str] = []
    facts: list[str] = []
    questions: list[str] = []
    for sample in json.loads(path.read_text(encoding="utf-8")):
        for key, session in sample["conversation"].items():
            if key.startswith("session_") and isinstance(session, list):
                turns += [turn["text"] for turn in session]
        for by_speaker in sample["observation"].values():
            for pairs in by_speaker.values():
                facts += [fact for fact, _ in pairs]
        questions += [q["question"] for q in sample["qa"]]
    return turns, turns + facts + questions


def timed(model: Embedder, texts: list[str]) -> tuple[float, np.ndarray]:
    started = time.perf_counter()
    vectors = model.encode(texts)
    return time.perf_counter() - started, vectors


def compare(workload: str, texts: list[str], torch: Embedder, fast: Embedder) -> EmbeddingRow:
    torch_seconds, expected = timed(torch, texts)
    fast_seconds, got = timed(fast, texts)
    cosines = np.sum(got.astype(np.float64) * expected, axis=1)
    row = EmbeddingRow(workload, len(texts), round(torch_seconds, 3), round(fast_seconds, 3),
                       round(float(cosines.min()), 6))
    row.notes.append(f"{len(texts) / torch_seconds:.0f} vs {len(texts) / fast_seconds:.0f} "
                     "texts/s")
    return row


def ingest_seconds(texts: list[str], backend: EmbeddingBackend, folder: Path) -> float:
    store = Store(f"sqlite:///{folder / f'ingest-{backend.value}.db'}")
    embedder = get_embedder(backend=backend)
    embedder.encode(["warm up"])  # loading the model is not the ingest's time
    with environment("REVERIE_EMIT_EVENTS", "false"):
        started = time.perf_counter()
        report = ingest(store, [{"content": t, "profile": "ingest"} for t in texts], embedder)
        seconds = time.perf_counter() - started
    if report.stored != len(texts):
        raise EmbeddingError(f"the ingest bench stored {report.stored} of {len(texts)} sentences")
    return seconds


def bench_embedding(locomo: Path | None, sentences: int = 2048) -> list[EmbeddingRow]:
    """Every workload on both backends (OpenVINO as the settings' cache folder has it)."""
    torch = get_embedder(backend=EmbeddingBackend.TORCH)
    fast = get_embedder(backend=EmbeddingBackend.OPENVINO)
    if fast.backend is not EmbeddingBackend.OPENVINO:
        raise EmbeddingError("embedding_backend=openvino did not load (the warning above says "
                             "why): nothing to compare PyTorch with")
    short = short_sentences(sentences)
    for model in (torch, fast):
        model.encode(short[:128])  # loaded and warm before anything is timed
    rows = [compare("short synthetic sentences", short, torch, fast)]
    if locomo is not None:
        turns, every = locomo_texts(locomo)
        rows.append(compare("LoCoMo turns", turns, torch, fast))
        rows.append(compare("5-memory summaries of LoCoMo turns", summaries(turns), torch, fast))
    rows.append(compare("5-memory summaries of synthetic sentences",
                        summaries(short_sentences(sentences * SUMMARY_MEMBERS // 4, seed=12)),
                        torch, fast))
    with tempfile.TemporaryDirectory(prefix="reverie-embed-bench-") as name:
        ingest = short_sentences(sentences, seed=13)
        torch_seconds = ingest_seconds(ingest, EmbeddingBackend.TORCH, Path(name))
        fast_seconds = ingest_seconds(ingest, EmbeddingBackend.OPENVINO, Path(name))
    rate = len(ingest) / fast_seconds
    rows.append(EmbeddingRow(
        "ingest + embed (models.ingest)", len(ingest), round(torch_seconds, 3),
        round(fast_seconds, 3), None,
        [f"{len(ingest) / torch_seconds:.0f} vs {rate:.0f} sentences/s",
         f"target >= {INGEST_TARGET:.0f} sentences/s on OpenVINO: "
         + ("met" if rate >= INGEST_TARGET else "missed")]))
    if locomo is not None:
        row = compare("every LoCoMo sentence (turns, facts, questions)", every, torch, fast)
        rows.append(row)
    return rows


def render_embedding(rows: list[EmbeddingRow]) -> str:
    lines = ["| workload | n | PyTorch s | OpenVINO s | speed-up | min cosine | notes |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        cosine = "" if r.min_cosine is None else f"{r.min_cosine:.5f}"
        lines.append(f"| {r.workload} | {r.n:,} | {r.torch_seconds:.2f} | "
                     f"{r.openvino_seconds:.2f} | {r.speedup:.1f}x | {cosine} | "
                     f"{'; '.join(r.notes)} |")
    return "\n".join(lines)
