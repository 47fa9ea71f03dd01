"""What a flow run did: the steps' reports of every profile, and the history rows a
finished run leaves in the store (what ``reverie status`` and a backfill's resume read).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from reverie.models.tables import RunRecord
from reverie.tasks.step import StepReport

# The pseudo-steps a profile fails in when it stayed busy, or its chunk's task failed.
WAIT_STEP = "wait"
CHUNK_STEP = "chunk"


@dataclass
class RunReport:
    flow: str
    profiles: list[str]
    as_of: str
    dry_run: bool
    run_id: str | None
    steps: list[StepReport] = field(default_factory=list)
    # Profiles another run was consolidating, skipped (REVERIE_BUSY_PROFILE=skip).
    skipped_profiles: list[str] = field(default_factory=list)
    # Profiles another run was consolidating, and how long this run waited for each.
    waited: dict[str, float] = field(default_factory=dict)
    # When the run took each profile and gave it back: its history row's times.
    spans: dict[str, tuple[datetime, datetime]] = field(default_factory=dict)
    # Why the run did nothing, when it did nothing (no profiles in the store, none given).
    note: str | None = None
    # A dry run's: what its real run would wait for before doing all it lists (forget's
    # deletions: an operator's approval), in a few words; None: nothing.
    waits_for: str | None = None

    def comparable(self) -> list[dict[str, Any]]:
        """The steps' reports without timings: what a dry run promises the real run does."""
        return [s.comparable() for s in self.steps]

    def changed(self) -> int:
        return sum(s.changed for s in self.steps)

    def failed(self) -> dict[str, list[str]]:
        """Profiles with a step that failed, and each failure ("step: error")."""
        failed: dict[str, list[str]] = {}
        for s in self.steps:
            if s.error is not None:
                failed.setdefault(s.profile, []).append(f"{s.step}: {s.error}")
        return failed


def history(
    report: RunReport, as_of: datetime, started: datetime, finished: datetime
) -> list[RunRecord]:
    """One history row per profile the run finished: what ``reverie status`` shows, and
    what a backfill's resume reads. A profile with a failed step gets none, so a
    re-run or a resumed backfill takes it again."""
    by: dict[str, list[StepReport]] = {}
    for s in report.steps:
        by.setdefault(s.profile, []).append(s)
    failed = report.failed()
    return [
        RunRecord(
            profile_id=profile, flow=report.flow, run_id=report.run_id, as_of=as_of,
            # The profile's own span: runs over the same profile never overlap in it.
            started_at=report.spans.get(profile, (started, finished))[0],
            finished_at=report.spans.get(profile, (started, finished))[1],
            examined=sum(s.examined for s in steps), changed=sum(s.changed for s in steps),
            seconds=round(sum(s.seconds for s in steps), 4),
            summary={s.step: {"changed": s.changed, "notes": s.notes} for s in steps},
        )
        for profile in report.profiles if profile not in failed
        for steps in [by.get(profile, [])]
    ]
