"""``reverie demo``: ingest the bundled sample store and run full consolidation on it.

Runs on the embedded default (a SQLite file, Prefect's ephemeral API, no server) and
prints a short report. The demo store is rebuilt on every run, so the report is the
same each time; the commands it prints let you explore the result.
"""

from __future__ import annotations

import os
from collections import defaultdict
from datetime import datetime
from pathlib import Path

SAMPLE_STORE = Path(__file__).resolve().parent / "sample" / "sample_store.jsonl"
DEFAULT_DEMO_DB = Path(".reverie") / "demo.db"
# The sample store covers December 2024 to June 2025; consolidate as of the day after.
DEMO_AS_OF = datetime(2025, 7, 1)


def run_demo(database: Path | None = None) -> int:
    from models.db import dispose

    path = (database or DEFAULT_DEMO_DB).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{path}"
    dispose(url)  # a process may hold connections to the file about to be replaced
    for stale in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        stale.unlink(missing_ok=True)
    os.environ["REVERIE_DATABASE_URL"] = url
    # Prefect reads this when it is first imported: keep its console to warnings.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

    from flows.full_consolidation import full_consolidation
    from models.store import Store

    store = Store(url)
    print(f"Reverie demo: store {path}")
    ingest = store.ingest_jsonl(SAMPLE_STORE)
    profiles = store.profiles()
    print(
        f"Ingested {ingest.stored} memories and {ingest.edges} edges "
        f"into {len(profiles)} profiles: {', '.join(profiles)}"
    )
    before = {p: store.counts(p) for p in profiles}

    print(f"Running full consolidation as of {DEMO_AS_OF:%Y-%m-%d} (Prefect, no server)...")
    report = full_consolidation(profile=None, as_of=DEMO_AS_OF)

    steps: dict[str, dict[str, object]] = defaultdict(dict)
    for step in report.steps:
        steps[step.profile][step.step] = step
    for p in profiles:
        after = store.counts(p)
        s = steps[p]
        dedup, decay, promote = s["dedup"], s["decay_edges"], s["promote"]
        print()
        print(f"== {p}: hot {before[p]['hot']} -> {after['hot']}, cold {after['cold']}")
        print(
            f"   merged {dedup.facts['groups']} near-duplicate groups "  # type: ignore[attr-defined]
            f"({dedup.facts['archived']} originals kept in cold); "  # type: ignore[attr-defined]
            f"promoted {promote.changed}; "  # type: ignore[attr-defined]
            f"edges decayed {decay.facts['decayed']}, pruned {decay.facts['pruned']}"  # type: ignore[attr-defined]
        )
        for change in dedup.changes:  # type: ignore[attr-defined]
            print(f"   merged: {store.get(change.target).content}  [{change.detail.split(' ')[0]} memories]")
        top = s["graph_importance"].facts["top"][:3]  # type: ignore[attr-defined]
        print("   top PageRank:")
        for mid in top:
            m = store.get(mid)
            print(f"     {m.pagerank:.4f}  {m.content}")  # type: ignore[union-attr]
        print("   Core Memory:")
        for block in store.blocks(p):
            first = block.content.split("\n---\n")[0] if block.content else "(empty)"
            more = block.content.count("\n---\n")
            print(
                f"     {block.block_type:<20} {len(block.content):>3} chars  {first[:70]}"
                + (f"  (+{more} more)" if more else "")
            )
    print()
    print("Explore it:")
    print(f"  export REVERIE_DATABASE_URL={url}")
    print('  reverie recall "how do we deploy the tracking service" --profile maya --deep')
    print("  reverie blocks --profile raj")
    print("  reverie consolidate full --profile maya --as-of 2025-07-01 --dry-run")
    return 0
