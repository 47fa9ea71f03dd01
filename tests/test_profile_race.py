"""Two first stores of one new profile, side by side: on PostgreSQL two processes (a
server's API workers) write at once, and both may find the profile missing. Neither may
fail on the profile's key (CI saw a 422 from ``test_api_workers``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime

import pytest
from sqlalchemy import select

from reverie.models.repositories.profiles import ensure_profiles
from reverie.models.store import Store
from reverie.models.tables import Profile

from conftest import TEST_POSTGRES

AT = datetime(2025, 1, 1)


@pytest.mark.skipif(not TEST_POSTGRES, reason="SQLite writes one transaction at a time")
def test_two_transactions_that_both_find_a_profile_missing_both_commit(
    new_store: Callable[[str], Store],
) -> None:
    store = new_store("race")
    start = threading.Barrier(2, timeout=60)
    failures: list[BaseException] = []

    def first_store(hold: float) -> None:
        try:
            start.wait()
            with store.writing_all() as s:
                ensure_profiles(s, ["newcomer"], AT)
                # The other has read the profile as missing by now, and waits for this
                # one's key.
                time.sleep(hold)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=first_store, args=(hold,)) for hold in (1.0, 0.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failures == []
    with store.reading_all() as s:
        assert list(s.execute(select(Profile.id)).scalars()) == ["newcomer"]
