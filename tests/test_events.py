"""Which events the store emits, that storing never depends on the Prefect API, and that
no event is lost while the API is down (the outbox)."""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta

import pytest
import stamina
from sqlalchemy import select

from reverie.models import events, outbox
from reverie.models.db import reading, writing
from reverie.models.events import crossings, session_events, stored_events
from reverie.models.store import Store
from reverie.models.tables import OutboxEvent
from reverie.models.timestamps import utcnow
from reverie.runner import event_delivery

from factories import embedder_of, end_session, ingest_records, record

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
    monkeypatch.setattr(event_delivery, "api_url", lambda: None)
    monkeypatch.setattr(event_delivery, "_send", lambda batch, url: sent.append(batch))
    ingest_records(store, [record(f"fact {i}") for i in range(60)], profile="ana")
    assert sent == []


def test_storing_does_not_fail_or_wait_when_the_api_is_down(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(event_delivery, "api_url", lambda: "http://127.0.0.1:9/api")  # no one there
    # The clock times storing, not this process's first load of the model (seconds on a
    # loaded machine, whatever the API does).
    embedder_of(store)
    started = time.monotonic()
    report = ingest_records(store, [record(f"fact {i}") for i in range(60)], profile="ana")
    assert report.stored == 60 and not report.errors
    assert end_session(store, "ana", "s1") == 1
    assert time.monotonic() - started < 2 * event_delivery.SEND_DEADLINE_SECONDS


# --- the outbox: events kept in the store until the API has them --------------------------

DOWN = "http://127.0.0.1:9/api"  # no one there


def pending_keys(store: Store) -> list[str]:
    with reading(store.url) as s:
        return list(s.execute(select(OutboxEvent.key).order_by(OutboxEvent.seq)).scalars())


def test_an_event_queued_again_stays_once_as_first_queued(store: Store) -> None:
    """A retried write queues its events again (same keys): the outbox keeps the first,
    on either store, and the new rows beside it go in."""
    first = events.ProfileEvent("reverie.memories.stored", "p", "p:stored:50", {"n": 50}, T)
    again = events.ProfileEvent("reverie.memories.stored", "p", "p:stored:50", {"n": 51}, T)
    other = events.ProfileEvent("reverie.memories.stored", "p", "p:stored:100", {"n": 100}, T)
    with writing(store.url) as s:
        outbox.add(s, [first])
    with writing(store.url) as s:
        assert outbox.add(s, [again, other]) == 2
    assert pending_keys(store) == ["p:stored:50", "p:stored:100"]
    with reading(store.url) as s:
        payloads = s.execute(select(OutboxEvent.payload).order_by(OutboxEvent.seq)).scalars()
        assert list(payloads) == [{"n": 50}, {"n": 100}]


class FakeApi:
    """The configured Prefect API, seen from our lowest-level send: it records each
    batch of event keys offered, and takes it when ``answer`` is None."""

    def __init__(self) -> None:
        self.answer: BaseException | None = ConnectionRefusedError("refused")
        self.offered: list[list[str]] = []
        self.delivered: list[list[str]] = []

    def send(self, batch: list[events.ProfileEvent], url: str) -> BaseException | None:
        assert url == DOWN
        self.offered.append([e.key for e in batch])
        if self.answer is None:
            self.delivered.append([e.key for e in batch])
        return self.answer


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi()
    monkeypatch.setattr(event_delivery, "api_url", lambda: DOWN)
    monkeypatch.setattr(event_delivery, "_send", fake.send)
    return fake


def test_ingest_queues_its_events_and_leaves_sending_to_its_caller(
    store: Store, api: FakeApi
) -> None:
    from reverie.models.ingest import ingest

    report = ingest(store, [record(f"fact {i}") for i in range(60)], embedder_of(store),
                    profile="ana", queue_events=True)
    assert report.stored == 60 and report.queued_events == 2
    assert pending_keys(store) == ["ana:stored:60", "ana:store-threshold:1"]
    assert api.offered == []  # models/ sends nothing: the caller delivers
    api.answer = None
    event_delivery.deliver(store.url)
    assert api.delivered == [["ana:stored:60", "ana:store-threshold:1"]]
    assert pending_keys(store) == []
    # Without queue_events (no API configured, or events off) nothing is kept at all.
    assert ingest(store, [record("one more")], embedder_of(store), profile="ana").queued_events == 0
    assert pending_keys(store) == []


def test_events_are_written_in_the_transaction_of_the_ingest(
    store: Store, api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_add = outbox.add

    def add_then_fail(s, queued):  # type: ignore[no-untyped-def]
        real_add(s, queued)
        raise RuntimeError("the ingest fails after queueing its events")

    monkeypatch.setattr(outbox, "add", add_then_fail)
    with pytest.raises(RuntimeError):
        ingest_records(store, [record(f"fact {i}") for i in range(60)], profile="ana")
    assert store.profiles() == [] and pending_keys(store) == []  # rolled back together
    monkeypatch.setattr(outbox, "add", real_add)
    # A process that dies right after its commit, before sending: the events are kept.
    monkeypatch.setattr(event_delivery, "deliver", lambda url: None)
    ingest_records(store, [record(f"fact {i}") for i in range(60)], profile="ana")
    assert pending_keys(store) == ["ana:stored:60", "ana:store-threshold:1"]
    assert api.offered == []  # nothing was tried


def test_events_wait_while_the_api_is_down_and_go_in_order_once_it_answers(
    store: Store, api: FakeApi, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="reverie.runner.event_delivery"):
        assert ingest_records(store, [record(f"fact {i}") for i in range(60)], profile="ana").stored == 60
    assert [r.getMessage() for r in caplog.records] == [
        f"could not send 2 event(s) to the Prefect API at {DOWN} (refused); 2 wait in the "
        "store for the next ingest or `reverie events flush`"]
    assert "fact" not in caplog.text
    assert end_session(store, "ana", "s1") == 1
    assert pending_keys(store) == ["ana:stored:60", "ana:store-threshold:1", "ana:session:1"]
    assert outbox.waiting(store.url)[0].events == 3
    api.answer = None
    ingest_records(store, [record(f"more {i}") for i in range(10)], profile="ana")
    assert api.delivered == [
        ["ana:stored:60", "ana:store-threshold:1", "ana:session:1", "ana:stored:70"]]
    assert pending_keys(store) == [] and outbox.waiting(store.url) == []
    # Delivered events are gone: a flush has nothing to send, the next ingest its own.
    assert event_delivery.flush(store.url) == event_delivery.FlushResult(event_delivery.Outcome.DELIVERED, 0, 0)
    ingest_records(store, [record("one more")], profile="ana")
    assert api.delivered[-1] == ["ana:stored:71"]
    assert len(api.delivered) == 2


def test_the_real_send_to_a_dead_api_keeps_the_events_with_one_warning(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(event_delivery, "api_url", lambda: DOWN)
    embedder_of(store)  # loaded before the clock starts: storing is what is timed
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        ingest_records(store, [record(f"fact {i}") for i in range(50)], profile="ana")
    assert time.monotonic() - started < 2 * event_delivery.SEND_DEADLINE_SECONDS
    assert [r.name for r in caplog.records if r.levelno >= logging.WARNING] == ["reverie.runner.event_delivery"]
    result = event_delivery.flush(store.url)
    assert result.outcome is event_delivery.Outcome.UNREACHABLE and result.sent == 0
    assert result.pending == 2 and result.error


def test_nothing_is_queued_without_an_api_or_with_events_off(
    store: Store, api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(event_delivery, "api_url", lambda: None)
    ingest_records(store, [record(f"fact {i}") for i in range(60)], profile="ana")
    end_session(store, "ana")
    monkeypatch.setattr(event_delivery, "api_url", lambda: DOWN)
    monkeypatch.setenv("REVERIE_EMIT_EVENTS", "false")
    ingest_records(store, [record(f"other {i}") for i in range(60)], profile="ana")
    assert pending_keys(store) == [] and api.offered == []


def test_a_second_sender_leaves_the_events_to_the_first_which_sends_them_all(
    store: Store, api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(event_delivery, "deliver", lambda url: None)  # queue only
    ingest_records(store, [record(f"fact {i}") for i in range(50)], profile="ana")
    api.answer = None
    real_send = event_delivery._send
    during: list[event_delivery.FlushResult] = []

    def slow_send(batch, url):  # type: ignore[no-untyped-def]
        if not during:  # while the first send is under way, another process ingests
            end_session(store, "ana", "s1")  # queues one more event
            during.append(event_delivery.flush(store.url))
        return real_send(batch, url)

    monkeypatch.setattr(event_delivery, "_send", slow_send)
    result = event_delivery.flush(store.url)
    assert during[0].outcome is event_delivery.Outcome.BUSY and during[0].sent == 0
    assert result == event_delivery.FlushResult(event_delivery.Outcome.DELIVERED, 3, 0)
    assert api.delivered == [
        ["ana:stored:50", "ana:store-threshold:1"], ["ana:session:1"]]


def test_a_dead_senders_claim_lapses_and_its_events_are_sent(
    store: Store, api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(event_delivery, "deliver", lambda url: None)
    ingest_records(store, [record("fact")], profile="ana")
    api.answer = None
    with writing(store.url) as s:  # claimed by a process that then died
        outbox.claim(s, "dead", utcnow() - timedelta(seconds=outbox.CLAIM_SECONDS / 2))
    assert event_delivery.flush(store.url).outcome is event_delivery.Outcome.BUSY
    with writing(store.url) as s:
        outbox.settle(s, "nobody", delivered=False)  # not its claim: nothing changes
        outbox.claim(s, "dead", utcnow() - timedelta(seconds=2 * outbox.CLAIM_SECONDS))
    assert event_delivery.flush(store.url) == event_delivery.FlushResult(event_delivery.Outcome.DELIVERED, 1, 0)
    assert api.delivered == [["ana:stored:1"]]


def test_the_events_command_lists_and_flushes(
    store: Store, api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    from reverie.deployments.cli import EXIT_ERROR, EXIT_OK, main

    assert store.profiles() == []  # opening the store makes it
    assert main(["events"]) == EXIT_OK and "no events waiting" in capsys.readouterr().out
    ingest_records(store, [record(f"fact {i}") for i in range(50)], profile="ana")
    assert main(["events"]) == EXIT_OK
    assert capsys.readouterr().out.startswith("ana: 2 event(s) waiting, the oldest from ")
    assert main(["events", "flush", "--timeout", "1"]) == EXIT_ERROR
    out, err = capsys.readouterr()
    assert out == "sent 0, waiting 2\n"
    assert "2 event(s) not sent: the Prefect API did not take them (refused) in 1 s" in err
    assert len(api.offered) >= 2  # tried again within the second, not once
    api.answer = None
    assert main(["events", "flush", "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out) == {
        "outcome": "delivered", "sent": 2, "pending": 0, "error": None}


def test_flushing_tries_again_until_the_api_answers(
    store: Store, api: FakeApi, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from reverie.deployments.cli import EXIT_OK, main

    ingest_records(store, [record(f"fact {i}") for i in range(50)], profile="ana")
    refusing = api.send

    def back_on_the_third_try(batch: list[events.ProfileEvent], url: str
                              ) -> BaseException | None:
        if len(api.offered) == 2:
            api.answer = None  # the server is up again
        return refusing(batch, url)

    monkeypatch.setattr(event_delivery, "_send", back_on_the_third_try)
    stamina.set_testing(True, attempts=100, cap=True)  # the same tries, without waiting
    try:
        assert main(["events", "flush", "--timeout", "30"]) == EXIT_OK
    finally:
        stamina.set_testing(False)
    assert capsys.readouterr().out == "sent 2, waiting 0\n"
    assert len(api.offered) == 3 and api.delivered == [api.offered[-1]]


def test_senders_at_the_same_time_send_each_event_once(
    store: Store, api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    monkeypatch.setattr(event_delivery, "deliver", lambda url: None)
    for n in range(1, 6):
        ingest_records(store, [record(f"fact {n}")], profile="ana")
        end_session(store, "ana", f"s{n}")
    api.answer = None
    order = pending_keys(store)
    fake_send = api.send

    def slow_send(batch, url):  # type: ignore[no-untyped-def]
        time.sleep(0.2)  # the others try meanwhile
        return fake_send(batch, url)

    monkeypatch.setattr(event_delivery, "_send", slow_send)
    results: list[event_delivery.FlushResult] = []
    senders = [threading.Thread(target=lambda: results.append(event_delivery.flush(store.url)))
               for _ in range(4)]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    sent = [key for batch in api.delivered for key in batch]
    assert sent == order and len(set(sent)) == 11  # 5 stored, 5 ended, 1 threshold
    assert sum(r.sent for r in results) == 11 and pending_keys(store) == []
