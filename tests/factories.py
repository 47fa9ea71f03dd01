"""Builders for test data with exactly the geometry a rule's boundary needs."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from reverie.models.records import MemoryView
from reverie.models.vectors import DIMENSION

AS_OF = datetime(2025, 7, 1)


def view(mid: str, **fields: Any) -> MemoryView:
    values: dict[str, Any] = {
        "id": mid,
        "profile_id": "p",
        "content": f"memory {mid}",
        "kind": "semantic",
        "importance": 0.5,
        "confidence": 0.5,
        "stability": 1.0,
        "access_count": 0,
        "created_at": AS_OF - timedelta(days=10),
    }
    values.update(fields)
    return MemoryView(**values)


def axis(i: int, dim: int = DIMENSION) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    v[i] = 1.0
    return v


def at_cosine(cos: float, base: int = 0, other: int = 1, dim: int = DIMENSION) -> np.ndarray:
    """A unit vector whose float32 cosine with axis ``base`` is exactly float32(cos)."""
    v = np.zeros(dim, dtype=np.float32)
    v[base] = np.float32(cos)
    v[other] = np.float32(math.sqrt(max(0.0, 1.0 - float(np.float32(cos)) ** 2)))
    return v


def below(cos: float) -> float:
    """The largest float32 strictly below ``cos``: the first value a threshold excludes."""
    return float(np.nextafter(np.float32(cos), np.float32(-1.0)))


def record(content: str, **fields: Any) -> dict[str, Any]:
    return {"content": content, **fields}
