"""Synthetic memory stores of any size, shaped like real ones, for ``reverie bench``.

Uniform random 384-dimensional vectors are all nearly orthogonal to each other:
every approximate index looks broken on them and no step finds any work. Real
sentence embeddings are anisotropic and clustered, so the vectors here are built the
same way: a direction shared by all, a topic, a subtopic and noise. With the weights
below, two memories have a cosine of about 0.10 in general, 0.48 within a topic and
0.78 within a subtopic (so subtopics become clusters at the 0.75 cluster threshold),
and a near-duplicate group about 0.94 (merged at the 0.85 dedup threshold). The
noise spreads each of those by a few hundredths, so many pairs sit near a threshold,
where approximate search is most likely to miss.

``embeddings="real"`` embeds the generated sentences with the real model instead;
the sentences share words by topic and subtopic, so their vectors cluster too.
Everything else (kinds, ages, use, sessions, association edges, cold notes) is drawn
from fixed distributions with a fixed seed: the same spec gives the same store.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import numpy as np

from reverie.models.errors import ConfigError
from reverie.models.vectors import DIMENSION

# Variance shares of a vector: shared direction, topic, subtopic, noise.
COMMON, TOPIC, SUBTOPIC, NOISE = 0.10, 0.38, 0.30, 0.22
# A near-duplicate keeps this share of its group's base vector.
DUPLICATE_KEEP = 0.94
DUPLICATE_GROUP_SIZES = (3, 4, 5)
MEMORIES_PER_SUBTOPIC = 20
SUBTOPICS_PER_TOPIC = 10
# Association edges per memory, between members of one subtopic.
EDGES_PER_MEMORY = 0.1
KINDS = ("episodic", "semantic", "decision", "preference", "procedural")
KIND_SHARES = (0.40, 0.30, 0.12, 0.12, 0.06)
COLD_LAYERS = ("context", "emotion", "implementation")
COLD_NOTE_SHARE = 0.08
SPAN_DAYS = 365
MEMORIES_PER_SESSION = 25

_SUBJECTS = ("the user", "Sam", "Priya", "the team", "the customer", "Lee", "the manager")
_VERBS = ("prefers", "decided on", "asked about", "mentioned", "worked on", "reviewed",
          "complained about", "planned", "fixed", "compared")
_NOUNS = ("database", "deploy", "budget", "holiday", "garden", "recipe", "invoice", "python",
          "marathon", "piano", "mortgage", "camera", "kafka", "roadmap", "allergy", "novel",
          "router", "dentist", "wedding", "backup", "sprint", "podcast", "bicycle", "tax")
_DETAILS = ("migration", "schedule", "pricing", "settings", "review", "plan", "timeline",
            "checklist", "incident", "upgrade", "notes", "estimate", "draft", "retry")


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    """What store to make: ``memories`` in total over ``profiles`` profiles (split
    evenly), ``duplicate_share`` of them in near-duplicate groups."""

    memories: int
    profiles: int = 1
    duplicate_share: float = 0.10
    embeddings: Literal["random", "real"] = "random"
    seed: int = 7
    as_of: datetime = datetime(2026, 1, 1)

    def __post_init__(self) -> None:
        if self.memories < 1:
            raise ConfigError(f"memories must be at least 1, got {self.memories}")
        if not 1 <= self.profiles <= self.memories:
            raise ConfigError(f"profiles must be between 1 and {self.memories}")
        if not 0.0 <= self.duplicate_share <= 1.0:
            raise ConfigError(f"duplicate_share must be in [0, 1], got {self.duplicate_share}")
        if self.embeddings not in ("random", "real"):
            raise ConfigError(f"embeddings must be 'random' or 'real', got {self.embeddings!r}")


def profile_name(n: int) -> str:
    return f"bench-{n:04d}"


@dataclass(frozen=True, slots=True)
class Layout:
    """Each memory's topic, subtopic and near-duplicate group (-1: none), row-aligned."""

    topic: np.ndarray
    subtopic: np.ndarray
    group: np.ndarray


def layout(n: int, duplicate_share: float, rng: np.random.Generator) -> Layout:
    subtopics = max(1, n // MEMORIES_PER_SUBTOPIC)
    subtopic = rng.integers(0, subtopics, n)
    topic = subtopic // SUBTOPICS_PER_TOPIC
    group = np.full(n, -1, dtype=np.int64)
    wanted = int(round(n * duplicate_share))
    start, g = 0, 0
    order = rng.permutation(n)
    while start < wanted:
        size = min(int(rng.choice(DUPLICATE_GROUP_SIZES)), wanted - start)
        members = order[start : start + size]
        group[members] = g
        # A group's members are one memory said again: same subtopic.
        subtopic[members] = subtopic[members[0]]
        topic[members] = topic[members[0]]
        start, g = start + size, g + 1
    return Layout(topic, subtopic, group)


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _directions(count: int, rng: np.random.Generator) -> np.ndarray:
    return _unit(rng.standard_normal((count, DIMENSION), dtype=np.float32))


def clustered_vectors(shape: Layout, rng: np.random.Generator) -> np.ndarray:
    """Unit float32 vectors with the similarity structure described above."""
    n = len(shape.topic)
    common = _directions(1, rng)[0]
    topics = _directions(int(shape.topic.max()) + 1, rng)
    subtopics = _directions(int(shape.subtopic.max()) + 1, rng)
    out = np.empty((n, DIMENSION), dtype=np.float32)
    step = 65_536  # bounds the temporary arrays at a million rows
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        rows = (
            np.sqrt(COMMON) * common
            + np.sqrt(TOPIC) * topics[shape.topic[lo:hi]]
            + np.sqrt(SUBTOPIC) * subtopics[shape.subtopic[lo:hi]]
            + np.sqrt(NOISE) * _directions(hi - lo, rng)
        )
        out[lo:hi] = _unit(rows)
    grouped = np.flatnonzero(shape.group >= 0)
    if len(grouped):
        # Every member of a group is its base (the first member's vector) plus a little noise.
        _, first = np.unique(shape.group[grouped], return_index=True)
        base = out[grouped[first]][np.searchsorted(shape.group[grouped][first],
                                                   shape.group[grouped])]
        out[grouped] = _unit(
            np.sqrt(DUPLICATE_KEEP) * base
            + np.sqrt(1 - DUPLICATE_KEEP) * _directions(len(grouped), rng)
        )
    return out


def sentence(topic: int, subtopic: int, n: int, rng: np.random.Generator) -> str:
    noun = _NOUNS[topic % len(_NOUNS)]
    detail = _DETAILS[subtopic % len(_DETAILS)]
    subject = _SUBJECTS[int(rng.integers(len(_SUBJECTS)))]
    verb = _VERBS[int(rng.integers(len(_VERBS)))]
    return f"{subject} {verb} the {noun} {detail} (topic {topic}.{subtopic}, note {n})"


def records(spec: SyntheticSpec) -> tuple[list[dict[str, Any]], np.ndarray | None]:
    """Memory and edge records for ``models.ingest.ingest``, and the memories' vectors
    (row-aligned with the memory records; ``None`` when the model is to embed them)."""
    rng = np.random.default_rng(spec.seed)
    n = spec.memories
    shape = layout(n, spec.duplicate_share, rng)
    vectors = clustered_vectors(shape, rng) if spec.embeddings == "random" else None
    profile_of = np.arange(n) % spec.profiles
    kinds = rng.choice(len(KINDS), n, p=KIND_SHARES)
    age_days = rng.uniform(0, SPAN_DAYS, n)
    # Most memories are never used again; a few are used a lot.
    uses = np.minimum(rng.geometric(0.35, n) - 1, 60)
    used_days_ago = age_days * rng.uniform(0, 1, n)
    importance = rng.uniform(0.2, 0.9, n).round(3)
    confidence = rng.uniform(0.4, 1.0, n).round(3)
    cold_layer = np.where(rng.uniform(0, 1, n) < COLD_NOTE_SHARE,
                          rng.integers(0, len(COLD_LAYERS), n), -1)
    base_text: dict[int, str] = {}
    out: list[dict[str, Any]] = []
    for i in range(n):
        g = int(shape.group[i])
        if g >= 0 and g in base_text:
            # A near-duplicate: the group's sentence said again, a little differently.
            content = f"{base_text[g]}, again ({i})"
        else:
            content = sentence(int(shape.topic[i]), int(shape.subtopic[i]), i, rng)
            if g >= 0:
                base_text[g] = content
        created = spec.as_of - timedelta(days=float(age_days[i]))
        record: dict[str, Any] = {
            "id": f"m{i}",
            "profile": profile_name(int(profile_of[i])),
            "content": content,
            "kind": KINDS[int(kinds[i])],
            "created_at": created.isoformat(),
            "importance": float(importance[i]),
            "confidence": float(confidence[i]),
            "access_count": int(uses[i]),
            "session_id": f"s{i // MEMORIES_PER_SESSION}",
            "entity": f"entity-{int(shape.topic[i])}",
        }
        if uses[i]:
            used = spec.as_of - timedelta(days=float(used_days_ago[i]))
            record["last_accessed_at"] = used.isoformat()
        if cold_layer[i] >= 0:
            record["layer"] = COLD_LAYERS[int(cold_layer[i])]
        if vectors is not None:
            record["embedding"] = vectors[i]
        out.append(record)
    out.extend(_edges(shape, profile_of, spec, rng))
    return out, vectors


def _edges(
    shape: Layout, profile_of: np.ndarray, spec: SyntheticSpec, rng: np.random.Generator
) -> Iterator[dict[str, Any]]:
    """Association edges between memories of one subtopic and one profile, of all ages."""
    n = len(shape.subtopic)
    by_key = np.lexsort((shape.subtopic, profile_of))
    wanted = int(n * EDGES_PER_MEMORY)
    picks = rng.integers(0, max(n - 1, 1), wanted)
    seen: set[tuple[int, int]] = set()
    for p in picks:
        a, b = int(by_key[p]), int(by_key[min(p + 1, n - 1)])
        same = shape.subtopic[a] == shape.subtopic[b] and profile_of[a] == profile_of[b]
        if a == b or not same or (a, b) in seen:
            continue
        seen.add((a, b))
        touched = spec.as_of - timedelta(days=float(rng.uniform(0, 120)))
        yield {
            "type": "edge", "profile": profile_name(int(profile_of[a])),
            "source": f"m{a}", "target": f"m{b}", "weight": round(float(rng.uniform(0.2, 1)), 3),
            "last_strengthened_at": touched.isoformat(),
        }
