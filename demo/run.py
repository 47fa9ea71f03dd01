"""``reverie demo``: ingest the bundled sample store and run full consolidation on it.

Runs on the embedded default (a SQLite file, Prefect's ephemeral API, no server) and
prints a short report. The demo store is rebuilt on every run, so the report is the
same each time; the commands it prints let you explore the result.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from reverie.engines.embedding import embedder_for
from reverie.models.ingest import ingest_jsonl
from reverie.models.repositories.blocks import blocks as blocks_of
from reverie.models.repositories.memories import counts, get
from reverie.models.settings import using_database
from reverie.models.store import Store
from reverie.runner.event_delivery import deliver, wanted

if TYPE_CHECKING:
    from reverie.tasks.step import StepReport

SAMPLE_STORE = Path(__file__).resolve().parent / "sample" / "sample_store.jsonl"
DEFAULT_DEMO_DB = Path(".reverie") / "demo.db"
# The sample store covers December 2024 to June 2025; consolidate as of the day after.
DEMO_AS_OF = datetime(2025, 7, 1)


def run_demo(
    database: Path | None, api: Callable[[], AbstractContextManager[str | None]]
) -> int:
    """Ingest the sample store into ``database`` and consolidate it, with the flow's runs
    recorded by the Prefect API that ``api`` makes current (it yields the UI's address,
    or None when there is no UI to show): the CLI passes its local server."""
    from reverie.models.db import dispose

    path = (database or DEFAULT_DEMO_DB).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{path}"
    dispose(url)  # a process may hold connections to the file about to be replaced
    for stale in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        stale.unlink(missing_ok=True)
    # Prefect reads these when it is first imported (nothing above imports it): keep its
    # console to warnings (its run logs still reach the server), and from calling home.
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    with using_database(url):
        return _demo(url, path, api)


def _demo(url: str, path: Path, api: Callable[[], AbstractContextManager[str | None]]) -> int:
    from reverie.flows.full_consolidation import full_consolidation
    from reverie.runner.runtime import wait_for_run_history

    store = Store(url)
    print(f"Reverie demo: store {path}")
    embedder = embedder_for(store.settings)
    ingest = ingest_jsonl(store, SAMPLE_STORE, embedder,
                          queue_events=wanted())
    if ingest.created:
        print(f"Created a new store at {path}")
    if ingest.queued_events:
        deliver(store.url)
    profiles = store.profiles()
    print(
        f"Ingested {ingest.stored} memories and {ingest.edges} edges "
        f"into {len(profiles)} profiles: {', '.join(profiles)}"
    )
    before = {p: _counts(store, p) for p in profiles}

    print(f"Running full consolidation as of {DEMO_AS_OF:%Y-%m-%d} (a Prefect flow)...")
    with api() as ui:
        report = full_consolidation(profile=None, as_of=DEMO_AS_OF)
    wait_for_run_history(report.run_id)

    steps: dict[str, dict[str, StepReport]] = defaultdict(dict)
    for step in report.steps:
        steps[step.profile][step.step] = step
    for p in profiles:
        _print_profile(store, p, before[p], steps[p])
    print()
    reverie = _command()
    print("Explore it:")
    print(f"  export REVERIE_DATABASE_URL={url}")
    print(f'  {reverie} recall "how do we deploy the tracking service" --profile maya --deep')
    print(f"  {reverie} blocks --profile raj")
    print(f"  {reverie} consolidate full --profile maya --as-of 2025-07-01 --dry-run")
    if ui:
        print(f"Runs in Prefect's UI: {ui}/runs (`{reverie} server stop` stops it)")
    return 0


def _counts(store: Store, profile: str) -> dict[str, int]:
    with store.reading(profile) as tx:
        return counts(tx)


def _command() -> str:
    """How to call ``reverie`` from here: by name when it is on PATH, else by the path
    of the one installed beside this Python (the venv's, when it is not activated)."""
    import shutil
    import sys
    from pathlib import Path

    if shutil.which("reverie"):
        return "reverie"
    beside = Path(sys.executable).parent / "reverie"
    if beside.exists():
        try:
            return str(beside.relative_to(Path.cwd()))
        except ValueError:
            return str(beside)
    return f"{Path(sys.executable).name} -m reverie.deployments.cli"


def _print_profile(
    store: Store, profile: str, before: dict[str, int], steps: dict[str, StepReport]
) -> None:
    from reverie.models.block_text import SEPARATOR

    after = _counts(store, profile)
    dedup, decay = steps["dedup"], steps["decay_edges"]
    print()
    print(f"== {profile}: hot {before['hot']} -> {after['hot']}, cold {after['cold']}")
    print(
        f"   merged {dedup.facts['groups']} near-duplicate groups "
        f"({dedup.facts['archived']} originals kept in cold); "
        f"promoted {steps['promote'].changed}; "
        f"edges decayed {decay.facts['decayed']}, pruned {decay.facts['pruned']}"
    )
    with store.reading(profile) as tx:
        merged = [(change, get(tx.session, change.target, profile)) for change in dedup.changes]
        top = [get(tx.session, mid, profile)
               for mid in steps["graph_importance"].facts["top"][:3]]
        core = blocks_of(tx)
    for change, summary in merged:
        members = change.detail.split(" ")[0]
        # Summaries and top memories were just made or ranked: memories, not tombstones.
        print(f"   merged: {summary.content}  [{members} memories]")  # type: ignore[union-attr]
    print("   top PageRank:")
    for m in top:
        print(f"     {m.pagerank:.4f}  {m.content}")  # type: ignore[union-attr]  # as above
    print("   Core Memory:")
    for block in core:
        facts = block.content.split(SEPARATOR) if block.content else ["(empty)"]
        more = f"  (+{len(facts) - 1} more)" if len(facts) > 1 else ""
        print(f"     {block.block_type:<20} {len(block.content):>3} chars  {facts[0][:70]}{more}")
