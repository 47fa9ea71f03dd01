"""A step that frees a lot hands it back: a worker that ran one large profile must not
carry that profile's peak into every later one (glibc keeps freed heap pages)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from reverie.models.config import ConsolidationConfig
from reverie.models.db import create_store
from reverie.tasks import step
from reverie.tasks.step import StepArgs, StepReport, resident_bytes, run_step

MB = 1024 * 1024
# Kept past the step: one small object in every few pages pins the heap's top, so that
# glibc cannot shrink the heap by itself and only a trim returns the pages in between.
survivors: list[bytes] = []


def fragmenting_step(_store: object, _args: StepArgs) -> StepReport:
    chunks = [bytes(1000) + i.to_bytes(4, "little") for i in range(300_000)]  # ~300 MB
    survivors.extend(chunks[::64])
    return StepReport("fragmenting", _args.profile, examined=len(chunks))


@pytest.fixture
def args(tmp_path) -> Iterator[StepArgs]:
    # The steps here never read it, but a step is run on a store that exists.
    url = f"sqlite:///{tmp_path / 'unused.db'}"
    create_store(url)
    yield StepArgs(url, "p", datetime(2026, 1, 1, tzinfo=UTC), ConsolidationConfig())
    survivors.clear()


@pytest.mark.skipif(step._malloc_trim() is None or resident_bytes() == 0,
                    reason="needs glibc and /proc")
def test_a_step_that_left_the_process_much_larger_gives_the_freed_pages_back(
    args: StepArgs, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The control: without the hand-back the freed pages stay resident. Each half starts
    # from a trimmed heap: pages that earlier tests freed would otherwise absorb the step's
    # allocation and hide what it leaves behind.
    monkeypatch.setattr(step, "GIVE_BACK_BYTES", 1 << 62)
    step.give_back_freed_memory()
    before = resident_bytes()
    run_step("fragmenting", fragmenting_step, args)
    kept = resident_bytes() - before
    assert kept > 150 * MB
    survivors.clear()
    step.give_back_freed_memory()

    monkeypatch.setattr(step, "GIVE_BACK_BYTES", 64 * MB)
    step.give_back_freed_memory()
    before = resident_bytes()
    report = run_step("fragmenting", fragmenting_step, args)
    assert report.examined == 300_000
    assert resident_bytes() - before < 64 * MB


def test_a_failing_step_still_gives_back_and_raises(
    args: StepArgs, monkeypatch: pytest.MonkeyPatch
) -> None:
    given: list[bool] = []
    monkeypatch.setattr(step, "give_back_freed_memory", lambda: given.append(True))
    monkeypatch.setattr(step, "GIVE_BACK_BYTES", 0)

    def failing(_store: object, _args: StepArgs) -> StepReport:
        raise ValueError("bad record")

    with pytest.raises(ValueError, match="bad record"):
        run_step("failing", failing, args)
    assert given == [True]


def test_a_small_step_does_not_walk_the_heap(
    args: StepArgs, monkeypatch: pytest.MonkeyPatch
) -> None:
    given: list[bool] = []
    monkeypatch.setattr(step, "give_back_freed_memory", lambda: given.append(True))
    run_step("small", lambda _s, a: StepReport("small", a.profile, examined=3), args)
    assert given == []


def test_a_step_runs_without_the_cyclic_collector_and_gives_it_back(args: StepArgs) -> None:
    """A step's snapshot and plan hold no cycles; the collector's walks of them were a
    second of dedup's CPU at 100k. Back on after the step, whether it ends or fails."""
    import gc

    seen: list[bool] = []

    def looking(_store: object, a: StepArgs) -> StepReport:
        seen.append(gc.isenabled())
        return StepReport("looking", a.profile)

    def failing(_store: object, a: StepArgs) -> StepReport:
        seen.append(gc.isenabled())
        raise RuntimeError("the step's own fault")

    assert gc.isenabled()
    run_step("looking", looking, args)
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        run_step("failing", failing, args)
    assert seen == [False, False] and gc.isenabled()
    gc.disable()  # off already (a caller's pause): left off, its owner's to turn back on
    try:
        run_step("looking", looking, args)
        assert not gc.isenabled()
    finally:
        gc.enable()
