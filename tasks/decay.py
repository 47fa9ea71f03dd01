"""Relevance decay (AutoMem's daily task), for a whole profile at once.

For every live hot memory::

    relevance = min(1, exp(-0.01 * age_days)
                       * access
                       * (1 + 0.3 * ln(1 + relationships))
                       * (0.5 + importance)
                       * (0.7 + 0.3 * confidence))

where ``access`` is 1.0 if the memory was accessed within 24 hours of ``as_of`` and
``exp(-0.05 * days_since_access)`` otherwise, and ``relationships`` counts the edges
touching the memory. A memory never accessed counts from its creation; times after
``as_of`` count as ``as_of`` (nothing gets younger than new). Unknown importance or
confidence score as the configured defaults (0.5). All rates are settings.

Computed with NumPy over column arrays and written in one bulk update of the values
that changed; a dry run computes the same and writes nothing.

The steps that select on relevance (compression, creative, cluster, forget) use the
score decay stored last and do not rescore: their own writes (edges, archives) change
the inputs, so a rescoring step would change the store again in a second run of the
same date. Instead each says, in its report (so the run's artifact) and its log, when
the profile's last recorded decay ran for a date more than ``stale_after_days`` (a
DecayConfig field) from its own ``as_of``: the daily schedule runs decay an hour before the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NamedTuple

import numpy as np

from reverie.models.config import DecayConfig
from reverie.models.records import MemoryView, RelevanceInputs, RelevanceSpread
from reverie.models.repositories.memories import relevance_inputs, set_relevance
from reverie.models.repositories.runs import last_as_of
from reverie.models.store import ProfileTx, Store
from reverie.models.timestamps import DAY_SECONDS, days_between
from reverie.tasks.step import Change, StepArgs, StepReport, run_logger, step_task

# Relevance bands reported after each run: (name, lower bound exclusive).
BANDS = (("high", 0.7), ("medium", 0.3), ("low", 0.1), ("archive", -np.inf))


def relevance(inputs: RelevanceInputs, as_of: datetime, config: DecayConfig) -> np.ndarray:
    """The relevance of every row of ``inputs`` at ``as_of``."""
    now = as_of.replace(tzinfo=UTC).timestamp()
    created = np.where(np.isnan(inputs.created), now, inputs.created)
    accessed = np.where(np.isnan(inputs.accessed), created, inputs.accessed)
    age_days = np.maximum(now - created, 0.0) / DAY_SECONDS
    idle_days = np.maximum(now - accessed, 0.0) / DAY_SECONDS
    access = np.where(
        idle_days * 24.0 <= config.recent_access_hours,
        1.0,
        np.exp(-config.access_rate_per_day * idle_days),
    )
    importance = np.where(np.isnan(inputs.importance), config.default_importance, inputs.importance)
    confidence = np.where(np.isnan(inputs.confidence), config.default_confidence, inputs.confidence)
    score = (
        np.exp(-config.base_rate_per_day * age_days)
        * access
        * (1.0 + config.relationship_weight * np.log1p(inputs.relationships))
        * (0.5 + importance)
        * (0.7 + 0.3 * confidence)
    )
    return np.minimum(score, 1.0)


class DecayPlan(NamedTuple):
    scores: np.ndarray  # the relevance each row holds after the step
    eligible: np.ndarray  # rows the step decays (not held back by the importance threshold)
    write: np.ndarray  # rows whose stored score changes


def plan_decay(inputs: RelevanceInputs, as_of: datetime, config: DecayConfig) -> DecayPlan:
    """New scores for every eligible row; rows below the optional importance threshold
    keep the score they had."""
    fresh = relevance(inputs, as_of, config)
    eligible = np.ones(len(fresh), dtype=bool)
    if config.importance_threshold is not None:
        known = np.where(np.isnan(inputs.importance), config.default_importance, inputs.importance)
        eligible = known >= config.importance_threshold
    scores = np.where(eligible, fresh, inputs.relevance)
    write = eligible & (scores != inputs.relevance)
    return DecayPlan(scores, eligible, write)


def distribution(scores: np.ndarray) -> list[dict[str, object]]:
    """How many scores fall in each relevance band."""
    rows: list[dict[str, object]] = []
    remaining = np.ones(len(scores), dtype=bool)
    for name, lower in BANDS:
        inside = remaining & (scores > lower)
        rows.append({"band": name, "above": max(lower, 0.0), "memories": int(inside.sum())})
        remaining &= ~inside
    return rows


def _score(value: float) -> str:
    return "unscored" if np.isnan(value) else f"{value:.4f}"


def decay(store: Store, args: StepArgs) -> StepReport:
    """Recompute the relevance of the profile's live hot memories at ``as_of``."""
    with args.reading(store) as tx:
        inputs = relevance_inputs(tx)
    scores, eligible, write = plan_decay(inputs, args.as_of, args.config.decay)
    rows = np.flatnonzero(write)
    with args.writing(store) as tx:
        changed = [inputs.ids[i] for i in rows]
        set_relevance(tx, list(zip(changed, scores[rows].tolist(), strict=True)))
    report = StepReport("decay", args.profile, examined=len(scores))
    report.skipped = int(np.count_nonzero(~eligible))
    report.tally(len(rows), (
        Change("rescored", inputs.ids[i], f"relevance {_score(inputs.relevance[i])} -> "
               f"{scores[i]:.4f}")
        for i in rows
    ))
    bands = distribution(scores[~np.isnan(scores)])
    report.facts = {"distribution": {row["band"]: row["memories"] for row in bands}}
    report.tables = {"distribution": [{"profile": args.profile, **row} for row in bands]}
    return report


decay_task = step_task("decay", decay)


DECAY_FLOW = "decay"
DEFAULT_DECAY = DecayConfig()


def relevance_notes(
    tx: ProfileTx, as_of: datetime, scored: bool, config: DecayConfig = DEFAULT_DECAY,
) -> list[str]:
    """What a step acting on stored relevance tells about it: that there is none yet, or
    that the profile's last recorded decay ran for a date more than
    ``config.stale_after_days`` before (or after) the step's ``as_of``. Logged as a
    warning too; never memory content."""
    if not scored:
        return ["no memory has a relevance score yet: run decay first"]
    profile = tx.profile
    last = last_as_of(tx.session, profile, DECAY_FLOW)
    if last is None:
        return []
    days = days_between(last, as_of)
    if abs(days) <= config.stale_after_days:
        return []
    when = last.isoformat(sep=" ", timespec="minutes")
    note = (f"relevance is {days:.1f} days older than as_of (last decay as of {when}): "
            "run decay for this date first for current scores" if days > 0 else
            f"relevance was computed as of {when}, {-days:.1f} days after as_of")
    run_logger().warning("profile=%s: %s", profile, note)
    return [note]


def none_above_note(
    memories: Sequence[MemoryView] | RelevanceSpread, floor: float, doing: str
) -> list[str]:
    """Why a step that takes memories of relevance above ``floor`` did nothing, when
    that is why: scores exist, and none is above (say, decay ran for a date long after
    the memories were last used). Given the rows, or their RelevanceSpread."""
    spread = memories if isinstance(memories, RelevanceSpread) else RelevanceSpread.of(memories)
    if spread.live_highest is None or spread.live_highest > floor:
        return []
    return [f"no memory's relevance is above {floor:g} (the highest of {spread.live_scored} "
            f"is {spread.live_highest:.3f}): nothing to {doing}"]
