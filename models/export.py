"""A canonical JSONL dump of one profile, used to compare states of the store.

Lines come in a fixed order (memories, edges, blocks, consolidations, tombstones),
each group sorted by id, each line with sorted keys. Vectors appear as a hash.
Run ids are left out unless asked for: two runs of the same history differ only
in them, and "the same store" should compare equal. A memory's ``ingest_seq`` is
always left out: it numbers the ingests in the order they happened to commit, which
says when a row was written, not what the store holds (a backup keeps it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from sqlalchemy import select

from reverie.models import tables
from reverie.models.store import Store

_ORDER: tuple[tuple[str, type, tuple[str, ...]], ...] = (
    ("memory", tables.Memory, ("id",)),
    ("edge", tables.Edge, ("id",)),
    ("block", tables.CoreBlock, ("block_type",)),
    ("consolidation", tables.Consolidation, ("id",)),
    ("tombstone", tables.Tombstone, ("memory_id",)),
)
_VOLATILE = {"run_id"}
_UNEXPORTED = {"ingest_seq"}


def export_rows(url: str, profile: str, include_run_ids: bool = False) -> Iterator[dict[str, Any]]:
    with Store(url).reading_all() as s:
        for label, table, keys in _ORDER:
            t = tables.table_of(table)
            query = select(t).where(t.c.profile_id == profile).order_by(*(t.c[k] for k in keys))
            if table is tables.Memory:  # each memory line carries its vector's hash
                v = tables.table_of(tables.MemoryVector)
                query = query.add_columns(v.c.embedding).outerjoin(v, v.c.memory_id == t.c.id)
            for row in s.execute(query).mappings():
                yield {"type": label, **_clean(dict(row), include_run_ids)}


def export_jsonl(url: str, profile: str, include_run_ids: bool = False) -> str:
    return "".join(
        json.dumps(row, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
        for row in export_rows(url, profile, include_run_ids)
    )


def _clean(row: dict[str, Any], include_run_ids: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if key in _UNEXPORTED or (key in _VOLATILE and not include_run_ids):
            continue
        if key == "embedding":
            out["embedding_sha256"] = (
                None if value is None else hashlib.sha256(value).hexdigest()[:16]
            )
        elif isinstance(value, datetime):
            out[key] = value.isoformat()
        else:
            out[key] = value
    return out
