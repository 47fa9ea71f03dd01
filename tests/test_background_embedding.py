"""Embedding on a worker thread while a step plans and writes: the same vectors as one
``encode`` of every text, failures reach the step, and nothing runs on after it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from test_flows import exports

from reverie.benchmarks.synthetic import SyntheticSpec, records
from reverie.engines import background_embedding
from reverie.engines.background_embedding import BackgroundEmbedding
from reverie.engines.embedding import get_embedder
from reverie.flows.decay import decay
from reverie.flows.full_consolidation import full_consolidation
from reverie.models.store import Store
from reverie.models.vectors import from_blobs

from factories import ingest_records

SYNTHETIC = SyntheticSpec(400)
TEXTS = [f"note {i}: the deploy of service {i % 7} moved to {'Tuesday' if i % 2 else 'Friday'}"
         + " and the runbook changed" * (i % 5) for i in range(300)]


class Gated:
    """The real model behind a gate: each ``encode`` (one chunk) waits until the test
    opens it, so a test sees the worker between chunks; ``fail_on``: the chunk whose
    encode raises instead."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.model = get_embedder()
        self.name, self.dimension = self.model.name, self.model.dimension
        self.started: list[int] = []
        self.chunks: list[int] = []
        self.gate = threading.Semaphore(0)
        self.fail_on = fail_on

    def encode(self, texts: list[str], progress: Callable[[int], None] | bool = False
               ) -> np.ndarray:
        self.started.append(len(texts))
        self.gate.acquire()
        self.chunks.append(len(texts))
        if len(self.chunks) == self.fail_on:
            raise RuntimeError("injected: the model failed")
        return self.model.encode(texts, progress)


def test_the_vectors_are_one_encode_of_every_text_in_the_order_handed_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chunks_of(monkeypatch, 50, 64)
    model = get_embedder()
    with BackgroundEmbedding(lambda: model) as embedding:
        for i, text in enumerate(TEXTS):
            embedding.add(f"k{i}", text)
        got = embedding.vectors()
        assert embedding.model_name() == model.name
    expected = model.encode(TEXTS)
    rows = from_blobs([got[f"k{i}"] for i in range(len(TEXTS))])
    assert list(got) == [f"k{i}" for i in range(len(TEXTS))]
    assert np.min(np.sum(rows * expected, axis=1)) >= 0.99999
    assert embedding.seconds > 0


def test_nothing_handed_in_loads_no_model_and_starts_no_thread() -> None:
    def never() -> None:
        raise AssertionError("the model was loaded for nothing")

    before = threading.active_count()
    with BackgroundEmbedding(never) as embedding:  # type: ignore[arg-type]
        embedding.close()
        embedding.wait(5)
        assert embedding.vectors() == {}
        assert embedding.model_name() is None
        assert threading.active_count() == before


def test_the_first_chunk_waits_for_min_chunk_texts_then_chunks_take_what_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chunks_of(monkeypatch, 3, 4)
    model = Gated()
    with BackgroundEmbedding(lambda: model) as embedding:
        for i in range(2):
            embedding.add(f"k{i}", TEXTS[i])
        assert not eventually(lambda: model.started, seconds=0.5)  # 2 < MIN_CHUNK
        embedding.add("k2", TEXTS[2])
        assert eventually(lambda: model.started == [3])
        for i in range(3, 9):  # handed in while the first chunk runs
            embedding.add(f"k{i}", TEXTS[i])
        for _ in range(3):
            model.gate.release()
        assert len(embedding.vectors()) == 9
    assert model.chunks == [3, 4, 2]


def eventually(check: Callable[[], object], seconds: float = 30.0) -> bool:
    """Whether ``check`` holds within ``seconds`` (polled)."""
    deadline = threading.Event()
    timer = threading.Timer(seconds, deadline.set)
    timer.start()
    try:
        while not deadline.is_set():
            if check():
                return True
            deadline.wait(0.01)
        return bool(check())
    finally:
        timer.cancel()


def test_wait_with_time_to_spare_returns_only_after_close_and_once_the_rest_is_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chunks_of(monkeypatch, 10, 10)
    model = Gated()
    returned = threading.Event()
    with BackgroundEmbedding(lambda: model) as embedding:
        for i in range(30):
            embedding.add(f"k{i}", TEXTS[i])
        waiter = threading.Thread(target=lambda: (embedding.wait(3600), returned.set()))
        waiter.start()
        model.gate.release()  # one chunk done: a pace, but more may be handed in
        # The chunk is the real model's encode: on a loaded machine it took longer than the
        # second this test once slept. Wait for the chunk itself (its texts are counted
        # batch by batch, so a pace comes before the chunk ends), then check the waiter.
        assert eventually(lambda: embedding.pending == 20)
        assert embedding.seconds_left() is not None
        assert not returned.wait(1.0)
        assert embedding.pending == 20
        embedding.close()  # the rest, at that pace, takes far less than an hour
        assert returned.wait(30)
        assert embedding.pending == 20
        for _ in range(2):
            model.gate.release()
        assert len(embedding.vectors()) == 30
        waiter.join()


def test_a_model_failure_reaches_the_caller_and_stops_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chunks_of(monkeypatch, 2, 2)
    model = Gated(fail_on=2)
    with pytest.raises(RuntimeError, match="injected"):
        with BackgroundEmbedding(lambda: model) as embedding:
            hand_in(embedding, 6)
            for _ in range(3):
                model.gate.release()
            embedding.vectors()
    assert model.chunks == [2, 2]  # the third chunk never started


def test_leaving_early_waits_for_the_chunk_in_flight_and_starts_no_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chunks_of(monkeypatch, 2, 2)
    model = Gated()

    def open_gate_later() -> None:
        threading.Event().wait(0.5)
        model.gate.release()

    with pytest.raises(KeyError):
        with BackgroundEmbedding(lambda: model) as embedding:
            hand_in(embedding, 6)
            # The step fails once the first chunk is in flight: had it failed before the
            # worker took one, no chunk would start at all (CI once saw that race).
            deadline = time.monotonic() + 60
            while not model.started and time.monotonic() < deadline:
                time.sleep(0.005)
            threading.Thread(target=open_gate_later).start()
            raise KeyError("the step failed while the model was embedding")
    assert model.started == model.chunks == [2]
    assert not any(t.name == "reverie-embedding" for t in threading.enumerate())


def chunks_of(monkeypatch: pytest.MonkeyPatch, first: int, most: int) -> None:
    monkeypatch.setattr(background_embedding, "MIN_CHUNK", first)
    monkeypatch.setattr(background_embedding, "MAX_CHUNK", most)


def hand_in(embedding: BackgroundEmbedding, count: int) -> None:
    for i in range(count):
        embedding.add(f"k{i}", TEXTS[i])


def test_add_after_close_is_refused() -> None:
    with BackgroundEmbedding(get_embedder) as embedding:
        embedding.close()
        with pytest.raises(RuntimeError):
            embedding.add("k", "late")


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("ahead", ["0", "600"])
def test_a_write_begun_before_the_last_vector_stores_what_a_write_after_it_stores(
    ahead: str, new_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 600 s: the write begins as soon as the model has a pace, before most vectors exist.
    chunks_of(monkeypatch, 1, 1)
    rows, _ = records(SYNTHETIC)
    stores = {}
    for name, seconds in (("after", "0"), ("ahead", ahead)):
        monkeypatch.setenv("REVERIE_WRITE_AHEAD_SECONDS", seconds)
        stores[name] = new_store(name)
        assert not ingest_records(stores[name], rows).errors
        monkeypatch.setenv("REVERIE_DATABASE_URL", stores[name].url)
        decay(profile=None, as_of=SYNTHETIC.as_of)
        report = full_consolidation(profile=None, as_of=SYNTHETIC.as_of)
        assert any(s.step == "compress_fading" and s.changed for s in report.steps)
    assert exports(stores["ahead"]) == exports(stores["after"])
