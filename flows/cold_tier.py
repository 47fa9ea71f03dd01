"""The cold tier's upkeep (cognitive-memory's maintenance tick): migration of long-unused
memories to the cold tier, then expiry of long-cold ones. Off by default.

::

    migrate_cold ──> expire_cold

Nothing happens unless ``config.cold_tier`` (or this flow's ``migrate_after_days`` /
``ttl_days``) sets the days. Migration archives (kept, found by ``recall --deep`` and
``reverie get``, undone by ``reverie undo <consolidation id>``) and needs no approval.
Expiry deletes (a tombstone stays), so it is approved: a run expires only with
``auto_approve_expiry`` (CLI: ``--approve-deletion``), set once a dry run has shown
what would go; without it, the run lists what it would expire, expires nothing and
says so. It never pauses: it is meant for a schedule, and an opt-in kept with the
deployment is the approval (the design: "unless its deployment says otherwise"). A dry run
lists exactly what the same run would do.
"""

from __future__ import annotations

from typing import Annotated

from prefect.futures import PrefectFuture
from pydantic import Field

from reverie.models.config import ConsolidationConfig, with_overrides
from reverie.models.settings import get_settings
from reverie.runner.parameters import AsOf, Config, DryRun, Profile
from reverie.runner.report import RunReport
from reverie.runner.run import run_for_profiles
from reverie.runner.runtime import reverie_flow
from reverie.tasks.cold_tier import expire_cold_task, expire_cold_unapproved_task, migrate_cold_task
from reverie.tasks.step import StepBatch, StepReport

FLOW_NAME = "cold-tier"

MigrateAfterDays = Annotated[float | None, Field(ge=1.0, le=36_500.0, description=(
    "Move live hot memories unused for this many days or more (since their last access, "
    "or creation) to the cold tier: kept, found by deep recall and by id, undoable. "
    "Empty: config.cold_tier.migrate_after_days (empty: migrate nothing). "
    "cognitive-memory's cold_migration_days is 7 (days at its retention floor)."
))]

TtlDays = Annotated[float | None, Field(ge=1.0, le=36_500.0, description=(
    "Expire memories cold for this many days or more: a tombstone (id, content hash, "
    "dates, reason) replaces each. Empty: config.cold_tier.ttl_days (empty: expire "
    "nothing). cognitive-memory's cold_storage_ttl_days is 180. Needs "
    "auto_approve_expiry."
))]

AutoApproveExpiry = Annotated[bool, Field(description=(
    "Let the run expire (delete, leaving tombstones) what is past the TTL. False lists "
    "what would be expired and expires nothing; set it once a dry run has shown the TTL "
    "is right."
))]


@reverie_flow(FLOW_NAME)
def cold_tier(
    profile: Profile = None,
    as_of: AsOf = None,
    dry_run: DryRun = False,
    config: Config = None,
    migrate_after_days: MigrateAfterDays = None,
    ttl_days: TtlDays = None,
    auto_approve_expiry: AutoApproveExpiry = False,
) -> RunReport:
    """Move long-unused memories to the cold tier, then turn memories cold for longer
    than the TTL into tombstones (only when approved)."""
    config = with_cold_tier(
        config or get_settings().consolidation_config(), migrate_after_days, ttl_days)
    expire = expire_cold_task if auto_approve_expiry else expire_cold_unapproved_task

    def dag(batch: StepBatch) -> list[PrefectFuture[list[StepReport]]]:
        migrated = migrate_cold_task.submit(batch)
        return [migrated, expire.submit(batch, after=[migrated])]

    return run_for_profiles(FLOW_NAME, profile, as_of, dry_run, config, dag)


def with_cold_tier(
    config: ConsolidationConfig, migrate_after_days: float | None, ttl_days: float | None
) -> ConsolidationConfig:
    """``config`` with the cold tier's days given (None keeps the config's own)."""
    return with_overrides(config, "cold_tier", migrate_after_days=migrate_after_days,
                          ttl_days=ttl_days)
