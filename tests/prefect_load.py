"""Prefect's own database under a backfill's load, measured by hand (not a test).

    .venv/bin/python tests/prefect_load.py --profiles 4 12 24 --dates 4 [--postgres URL]
    .venv/bin/python tests/prefect_load.py --mode runs --profiles 4 8 16 [--postgres URL]

For each number of profiles: a store of that many small profiles, the stack `reverie
serve` starts (server, worker, every deployment of prefect.yaml, the backfill
deployment's concurrency of 4 included), Prefect's database on SQLite in the stack's
home (or a fresh PostgreSQL database with --postgres), then `reverie backfill decay`
over ``--dates`` days for every profile, or (``--mode runs``) one decay run per profile
through its deployment, all at once, as automations firing for many profiles start
them; waited for. One line per load: the runs' (and a backfill's decay runs') final
states, the server's "database is locked" and timeouts in
the stack's log, the wall time and the load average (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reverie.demo.run import SAMPLE_STORE  # noqa: E402

# What the stack's log shows when Prefect's database does not hold.
TROUBLE = ("database is locked", "ReadTimeout", "503 Service Unavailable",
           "Crash detected", "Failed to ")


def _small_profiles(store_url: str, count: int, folder: Path) -> list[str]:
    from reverie.engines.embedding import embedder_for
    from reverie.models.ingest import ingest_jsonl
    from reverie.models.store import Store

    lines = [line for line in SAMPLE_STORE.read_text().splitlines()
             if json.loads(line)["profile"] == "maya"][:12]
    store = Store(store_url)
    embedder = embedder_for(store.settings)
    names = []
    for n in range(count):
        name = f"load-{n:03d}"
        path = folder / f"{name}.jsonl"
        path.write_text("\n".join(
            json.dumps({**json.loads(line), "id": f"{name}-{i}", "profile": name})
            for i, line in enumerate(lines)) + "\n")
        report = ingest_jsonl(store, path, embedder)
        assert not report.errors
        names.append(name)
    return names


def _side_by_side(names: list[str], day: datetime) -> list[str]:
    """One decay run per profile through the deployment, all at once: what automations
    firing for many profiles start (no deployment limit holds them back)."""
    from prefect.deployments import run_deployment

    return [str(run_deployment("decay/daily", timeout=0,
                               parameters={"profile": name, "as_of": day.isoformat()}).id)
            for name in names]


def measure(profiles: int, days: int, postgres: str | None, mode: str) -> dict[str, object]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    from reverie.deployments.backfill import backfill, wait_for_replays
    from reverie.models.store import Store

    from prefect_stack import environment, running_stack

    folder = Path(tempfile.mkdtemp(prefix="prefect-load-"))
    store_url = f"sqlite:///{folder / 'store.db'}"
    Store(store_url).create()
    names = _small_profiles(store_url, profiles, folder)
    prefect_db = None
    if postgres:
        from sqlalchemy import create_engine, text

        name = f"prefect_load_{uuid.uuid4().hex[:10]}"
        admin = create_engine(postgres, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
        admin.dispose()
        prefect_db = postgres.rsplit("/", 1)[0] + f"/{name}"
    load_before = os.getloadavg()[0]
    variables = {"PREFECT_API_DATABASE_CONNECTION_URL": prefect_db} if prefect_db else {}
    with environment(**variables), \
            running_stack(folder, store_url) as stack:
        started = time.monotonic()
        start = datetime(2025, 9, 1)
        if mode == "backfill":
            report = backfill("decay", start, start + timedelta(days=days - 1),
                              timedelta(days=1), names, stack.store)
            runs = report.runs
        else:
            runs = _side_by_side(names, start)
        ended = wait_for_replays(runs, poll=2)
        seconds = time.monotonic() - started
        children = []
        if mode == "backfill":
            with stack.client() as client:
                children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                    parent_flow_run_id=FlowRunFilterParentFlowRunId(
                        any_=[uuid.UUID(r) for r in runs])), limit=200)
        log = stack.log.read_text(errors="replace")
    load_after = os.getloadavg()[0]
    return {
        "prefect_db": "PostgreSQL" if postgres else "SQLite",
        "mode": mode, "profiles": profiles, "dates": days if mode == "backfill" else 1,
        "runs": dict(Counter(ended.values())),
        "decay_runs": dict(Counter(c.state_type.value for c in children if c.state_type)),
        "trouble": {t: log.count(t) for t in TROUBLE if t in log},
        "seconds": round(seconds),
        "load_average": [round(load_before, 1), round(load_after, 1)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--dates", type=int, default=5)
    parser.add_argument("--postgres", help="a PostgreSQL server URL (a database is made)")
    parser.add_argument("--mode", choices=["backfill", "runs"], default="backfill",
                        help="a backfill of every profile (4 replays at once), or one decay "
                        "run per profile, all at once")
    args = parser.parse_args()
    for count in args.profiles:
        print(json.dumps(measure(count, args.dates, args.postgres, args.mode)), flush=True)


if __name__ == "__main__":
    main()
