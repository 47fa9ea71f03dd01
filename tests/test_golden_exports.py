"""Behaviour held still: every flow, run in order over the sample store and over the
LoCoMo dev set, leaves each profile's canonical export byte for byte as recorded.

A change meant to keep behaviour (a restructuring) must pass this unchanged. A change
meant to alter it records the new exports with

    REVERIE_RECORD_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden_exports.py

and the diff of ``tests/data/golden/`` shows, line by line, what it changed.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from reverie.benchmarks.locomo import load_locomo
from reverie.demo.run import DEMO_AS_OF
from reverie.flows.catalog import FLOWS
from reverie.models.config import ConsolidationConfig
from reverie.models.export import export_jsonl
from reverie.models.store import Store

from factories import ingest_records

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo3.json"
RECORD = os.environ.get("REVERIE_RECORD_GOLDEN") == "1"
RULES = ConsolidationConfig(summarizer="rules")  # an LLM configured nearby changes nothing


def run_every_flow(as_of: datetime) -> None:
    """Each flow once, in the order a month of schedules runs them, with deletion on
    (auto-approved) so that tombstones are part of what is held still."""
    for name in ("decay", "full", "creative", "cluster", "compress", "cold-notes", "cold-tier"):
        FLOWS[name](profile=None, as_of=as_of, config=RULES)
    FLOWS["forget"](profile=None, as_of=as_of, config=RULES, archive_threshold=0.1,
                    delete_threshold=0.02, auto_approve_deletion=True)
    FLOWS["full"](profile=None, as_of=as_of + timedelta(days=1), config=RULES)


def check_against_golden(store: Store, name: str) -> None:
    for profile in store.profiles():
        exported = export_jsonl(store.url, profile)
        path = GOLDEN / f"{name}-{profile}.jsonl.gz"
        if RECORD:
            path.parent.mkdir(parents=True, exist_ok=True)
            # mtime=0: the same export makes the same file.
            path.write_bytes(gzip.compress(exported.encode(), mtime=0))
            continue
        assert path.exists(), f"no golden export for {name}/{profile}: record it (see above)"
        expected = gzip.decompress(path.read_bytes()).decode()
        if exported != expected:
            got, want = exported.splitlines(), expected.splitlines()
            first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                         min(len(got), len(want)))
            pytest.fail(
                f"{name}/{profile} export differs from the golden one ({len(got)} lines "
                f"against {len(want)}); first difference at line {first + 1}:\n"
                f"  now:    {got[first][:400] if first < len(got) else '(none)'}\n"
                f"  golden: {want[first][:400] if first < len(want) else '(none)'}")
    recorded = {p.name for p in GOLDEN.glob(f"{name}-*.jsonl.gz")}
    assert recorded == {f"{name}-{p}.jsonl.gz" for p in store.profiles()}


def test_every_flow_over_the_sample_store_ends_as_recorded(sample_store: Store) -> None:
    run_every_flow(DEMO_AS_OF)
    check_against_golden(sample_store, "sample")


@pytest.mark.skipif(not LOCOMO.exists(), reason=f"LoCoMo dev set not found at {LOCOMO}")
def test_every_flow_over_the_locomo_dev_set_ends_as_recorded(
    store: Store, new_store: Callable[[str], Store]
) -> None:
    conversations = load_locomo(LOCOMO)
    for conv in conversations:
        assert not ingest_records(store, conv.memories, profile=conv.profile).errors
    run_every_flow(max(c.last_session for c in conversations) + timedelta(days=90))
    check_against_golden(store, "locomo")
