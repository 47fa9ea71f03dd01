"""Which events the store emits, and that storing never depends on the Prefect API."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from models import events
from models.events import crossings, session_events, stored_events
from models.store import Store

from factories import record

T = datetime(2025, 7, 1)


def test_crossings_of_a_multiple() -> None:
    assert crossings(0, 49, 50) == 0
    assert crossings(0, 50, 50) == 1
    assert crossings(49, 50, 50) == 1
    assert crossings(50, 99, 50) == 0
    assert crossings(10, 130, 50) == 2
    assert crossings(0, 100, 0) == 0  # 0 turns the trigger off


def test_stored_events() -> None:
    (stored,) = stored_events("ana", 10, 20, T, 50)
    assert stored.name == events.MEMORY_STORED and stored.payload == {"count": 10, "store_count": 20}
    stored, threshold = stored_events("ana", 40, 60, T, 50)
    assert threshold.name == events.STORE_THRESHOLD and threshold.key == "ana:store-threshold:1"
    assert stored_events("ana", 60, 60, T, 50) == []


def test_session_events() -> None:
    assert [e.name for e in session_events("ana", "s4", 4, T, 5)] == [events.SESSION_ENDED]
    assert [e.name for e in session_events("ana", "s5", 5, T, 5)] == [
        events.SESSION_ENDED, events.SESSION_THRESHOLD]


def test_nothing_is_sent_without_a_prefect_api(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[object] = []
    monkeypatch.setattr(events, "api_url", lambda: None)
    monkeypatch.setattr(events, "_send", lambda batch, url: sent.append(batch))
    store.ingest([record(f"fact {i}") for i in range(60)], profile="ana")
    assert sent == []


def test_storing_does_not_fail_or_wait_when_the_api_is_down(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "api_url", lambda: "http://127.0.0.1:9/api")  # no one there
    started = time.monotonic()
    report = store.ingest([record(f"fact {i}") for i in range(60)], profile="ana")
    assert report.stored == 60 and not report.errors
    assert store.end_session("ana", "s1") == 1
    assert time.monotonic() - started < 2 * events.SEND_DEADLINE_SECONDS
