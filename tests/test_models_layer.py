"""models/ is the bottom layer: the store and its repositories know nothing of Prefect
(events are queued in the outbox; flows/ sends them), and opening a store or reading
from it never loads the embedding model (the caller hands ingest an embedder)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROBE = """
import importlib, pkgutil, sys
import reverie.models as models

names = [m.name for m in pkgutil.walk_packages(models.__path__, "reverie.models.")
         if ".migrations" not in m.name]
for name in names:
    importlib.import_module(name)
from reverie.models.repositories import memories
from reverie.models.store import Store

store = Store(sys.argv[1])
store.create()
store.profiles()
with store.reading("nobody") as tx:
    memories.memories(tx)
with store.writing("nobody") as tx:
    memories.set_relevance(tx, [])
heavy = sorted(m for m in ("prefect", "sentence_transformers", "torch") if m in sys.modules)
print(len(names), heavy)
"""


def test_no_models_module_imports_prefect_or_loads_the_model(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, f"sqlite:///{tmp_path / 'store.db'}"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    count, heavy = done.stdout.split(" ", 1)
    assert int(count) > 20  # every module was imported, repositories included
    assert heavy.strip() == "[]"
