"""Step 3: promote memories that are used often, trusted and still valid.

A hot, live memory is *eligible* when its access count and trust reach the
thresholds and it is temporally valid at ``as_of`` (an expired or superseded fact is
never promoted, however often it was used). Lifecycle follows eligibility both ways:
an eligible active memory is promoted, and a promoted one that is no longer eligible
(expired, or its trust lowered) returns to active. Applying the rule twice changes
nothing the second time.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from reverie.models.config import PromotionConfig
from reverie.models.records import MemoryView
from reverie.models.repositories.memories import ingested_since, set_lifecycles
from reverie.models.repositories.memories import memories as memories_of
from reverie.models.store import Store
from reverie.models.tables import Lifecycle
from reverie.tasks.step import Change, StepArgs, StepReport, preview, preview_chars, step_task


def is_eligible(memory: MemoryView, as_of: datetime, config: PromotionConfig) -> bool:
    return (
        memory.access_count >= config.min_access
        and memory.confidence >= config.min_trust
        and memory.valid_at(as_of)
    )


def plan_promotions(
    memories: Sequence[MemoryView], as_of: datetime, config: PromotionConfig
) -> list[tuple[MemoryView, str, str]]:
    """(memory, new lifecycle, reason) for every memory whose lifecycle must change."""
    out: list[tuple[MemoryView, str, str]] = []
    for m in memories:
        if not m.is_live:
            continue
        eligible = is_eligible(m, as_of, config)
        if m.lifecycle == Lifecycle.ACTIVE and eligible:
            out.append(
                (m, Lifecycle.PROMOTED, f"used {m.access_count}x, trust {m.confidence:g}, valid")
            )
        elif m.lifecycle == Lifecycle.PROMOTED and not eligible:
            why = "expired" if not m.valid_at(as_of) else "below the thresholds"
            out.append((m, Lifecycle.ACTIVE, why))
    return out


def promote(store: Store, args: StepArgs) -> StepReport:
    """Set the lifecycle of the profile's hot memories from their use, trust and validity."""
    profile, as_of, config = args.profile, args.as_of, args.config
    with args.reading(store) as tx:
        memories = memories_of(tx)
    plan = plan_promotions(memories, as_of, config.promotion)
    with args.writing(store) as tx:
        # A memory ingested again since the run took the profile may no longer meet
        # the rule the plan read: it waits for the next run.
        reingested = ingested_since(tx)
        waiting = [m for m, _, _ in plan if m.id in reingested]
        plan = [change for change in plan if change[0].id not in reingested]
        set_lifecycles(tx, [(m.id, lifecycle) for m, lifecycle, _ in plan])
    report = StepReport("promote", profile, examined=len(memories), skipped=len(waiting))
    for m in waiting:
        report.record(Change("deferred", m.id, "ingested again during the run: left for "
                             "the next run"), counts=False)
    chars = preview_chars()
    report.tally(len(plan), (
        Change("promoted" if lifecycle == Lifecycle.PROMOTED else "demoted", m.id, why,
               preview(m.content, chars))
        for m, lifecycle, why in plan
    ))
    return report


promote_task = step_task("promote", promote)
