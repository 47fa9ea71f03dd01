"""Controlled forgetting (off by default): archive or delete what has faded.

::

    forget                         nothing to delete, a dry run, or deletion auto-approved
    forget (deletion configured)   dry run on a scratch copy -> publish what would be
                                   deleted -> pause for a typed approval ->
        approved                   forget, deleting only the memories listed
        rejected                   forget with deletion off: archiving goes ahead
        no answer in time          the run fails; nothing deleted, nothing archived

Acts on the relevance the decay flow last stored: deleting a memory removes its edges
and so changes its neighbours' scores, which a rescoring forget would act on again
in a second run of the same date. A stale score errs on the side of keeping (scores
only fall with time). Nothing is forgotten unless ``config.forget`` sets a threshold
above 0.0; a dry run lists what would be archived, deleted and protected, and why.

Deletion is approved, as in Prefect's ``ai_database_cleanup_with_approval`` example:
a run that would delete first finds, with the real steps on a scratch copy (the dry
run's machinery), what it would delete, publishes it as the ``forget-approval``
artifact and pauses until someone answers ``DeletionApproval`` (the UI's Resume form,
or ``reverie approve <run id>``). An approval covers exactly the memories listed: one
selected only since (a newer score, a new profile) is not deleted. Archiving needs no
approval. A deployment may set ``auto_approve_deletion``; without a Prefect API no one
could answer, so such a run refuses to start instead of waiting.

A pause that times out cannot carry on: Prefect fails the run and lets no task of it
run after. So nothing at all is written then; the next run asks again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from prefect.futures import PrefectFuture
from prefect.input import RunInput
from pydantic import Field

from reverie.models.config import ConsolidationConfig, with_forget_thresholds
from reverie.models.errors import ConfigError, ReverieError
from reverie.models.settings import get_settings
from reverie.models.timestamps import DAY_SECONDS, parse_timestamp
from reverie.runner.event_delivery import api_configured
from reverie.runner.parameters import ArchiveBelow, AsOf, Config, DeleteBelow, DryRun, Profile
from reverie.runner.report import RunReport
from reverie.runner.run import run_for_profiles
from reverie.runner.runtime import reverie_flow
from reverie.runner.workspace import ProfileSelector
from reverie.tasks.forget import forget_task, forget_task_deleting
from reverie.tasks.step import StepBatch, StepReport, run_logger

FLOW_NAME = "forget"
APPROVAL_ARTIFACT = "forget-approval"
# A pause holds its process (a worker's, or the CLI's): bounded. An hour suits someone
# at hand; the operator deployment, scheduled at night, waits a day (prefect.yaml).
DEFAULT_APPROVAL_SECONDS = 3_600
MIN_APPROVAL_SECONDS, MAX_APPROVAL_SECONDS = 5, int(7 * DAY_SECONDS)
APPROVAL_POLL_SECONDS = 5
# The approval artifact is read by a person: it lists this many deletions and profiles
# (every one is approved all the same; the dry run's deletions table holds more).
APPROVAL_ROWS = 200
APPROVAL_PROFILES = 100

log = logging.getLogger(__name__)

ApprovalSeconds = Annotated[int, Field(
    ge=MIN_APPROVAL_SECONDS, le=MAX_APPROVAL_SECONDS,
    description="How long a run that would delete waits for approval (5 s to 7 days) "
    "before it fails, deleting and archiving nothing.",
)]


class DeletionApproval(RunInput):
    """An operator's answer to a forget run paused before deleting."""

    approve: bool = Field(
        False, description="true deletes the memories listed in the run's forget-approval "
        "artifact; false deletes none (archiving still happens).")
    reason: str = Field(
        "", max_length=500, description="Why, in a few words (kept in the run's log and "
        "its forget-approval artifact).")


class Approval(StrEnum):
    """Where a forget run stands with its deletions."""

    NOT_NEEDED = "not needed"
    AUTO = "auto-approved"
    WAITING = "waiting for approval"
    APPROVED = "approved"
    REJECTED = "rejected"
    TIMED_OUT = "timed out"


AutoApprove = Annotated[bool, Field(description=(
    "Delete without pausing for approval. For deployments whose thresholds were checked "
    "with a dry run; false asks every time."
))]


@reverie_flow(FLOW_NAME)
def forget(
    profile: Profile = None,
    as_of: AsOf = None,
    dry_run: DryRun = False,
    config: Config = None,
    archive_threshold: ArchiveBelow = None,
    delete_threshold: DeleteBelow = None,
    auto_approve_deletion: AutoApprove = False,
    approval_timeout_seconds: ApprovalSeconds = DEFAULT_APPROVAL_SECONDS,
) -> RunReport:
    """Archive or delete unprotected memories whose relevance fell below the thresholds;
    deletion waits for an operator's approval."""
    config = with_forget_thresholds(
        config or get_settings().consolidation_config(), archive_threshold, delete_threshold
    )
    asks = waits_for_approval(config, auto_approve_deletion)
    if dry_run:
        def say_if_it_waits(report: RunReport) -> None:
            # The real run pauses only when it finds something to delete, as here.
            if asks and (rows := deletions(report)):
                report.waits_for = f"an operator's approval before deleting {len(rows)} memories"

        return run_for_profiles(FLOW_NAME, profile, as_of, True, config, forget_profiles,
                                annotate=say_if_it_waits)
    if not asks:
        if config.forget.delete_threshold > 0.0:
            run_logger(log).info("forget: deletion below %g is auto-approved "
                                 "(auto_approve_deletion)", config.forget.delete_threshold)
        return run_for_profiles(FLOW_NAME, profile, as_of, False, config, forget_profiles)
    return forget_with_approval(profile, as_of, config, approval_timeout_seconds)


def waits_for_approval(config: ConsolidationConfig, auto_approve_deletion: bool) -> bool:
    """Whether a run (not a dry run) asks an operator before it deletes: deletion is
    configured and not approved up front. One test for the run and for its dry run,
    whose report says it (``RunReport.waits_for``)."""
    return config.forget.delete_threshold > 0.0 and not auto_approve_deletion


def forget_profiles(batch: StepBatch) -> list[PrefectFuture[list[StepReport]]]:
    return [forget_task.submit(batch)]


def forget_deleting(deletable: frozenset[str]) -> Callable[
        [StepBatch], list[PrefectFuture[list[StepReport]]]]:
    """The forget DAG for a run that may delete only ``deletable``."""
    task = forget_task_deleting(deletable)

    def dag(batch: StepBatch) -> list[PrefectFuture[list[StepReport]]]:
        return [task.submit(batch)]

    return dag


def forget_with_approval(
    profile: ProfileSelector, as_of: datetime | None, config: ConsolidationConfig,
    timeout: int,
) -> RunReport:
    """Find what the run would delete, ask for approval, then forget as answered."""
    if not api_configured():
        raise ConfigError(
            f"forget would delete (delete_threshold {config.forget.delete_threshold:g}) and "
            "waits for approval, but no Prefect API is configured that anyone could "
            "approve it through: set PREFECT_API_URL, or pass auto_approve_deletion=True "
            "(CLI: --approve-deletion)"
        )
    preview = run_for_profiles(FLOW_NAME, profile, as_of, True, config, forget_profiles)
    # The approved run acts as of the date the candidates were found for.
    as_of = parse_timestamp(preview.as_of) if preview.as_of else as_of
    rows = deletions(preview)
    if not rows:
        run_logger(log).info("forget: nothing would be deleted; no approval needed")
        # Nothing approved: a memory that fell below the threshold meanwhile is kept.
        return run_for_profiles(FLOW_NAME, profile, as_of, False, config,
                                forget_deleting(frozenset()))
    answer = ask_approval(preview, rows, config, timeout)
    if answer.approve:
        approved = frozenset(str(r["id"]) for r in rows)
        return run_for_profiles(FLOW_NAME, profile, as_of, False, config,
                                forget_deleting(approved))
    archive_only = with_forget_thresholds(config, None, 0.0)
    return run_for_profiles(FLOW_NAME, profile, as_of, False, archive_only, forget_profiles)


def deletions(report: RunReport) -> list[dict[str, Any]]:
    """Every deletion a (dry) run's forget steps list, profile by profile."""
    return [row for s in report.steps for row in s.tables.get("deletions", [])]


def ask_approval(
    preview: RunReport, rows: list[dict[str, Any]], config: ConsolidationConfig, timeout: int,
) -> DeletionApproval:
    """Publish the deletions, pause until someone answers, and say what the answer was.
    No answer in time: the run fails (Prefect lets nothing of it run after)."""
    from prefect.exceptions import FlowPauseTimeout
    from prefect.flow_runs import pause_flow_run

    logger = run_logger(log)
    run_id, profiles = preview.run_id, len({r["profile"] for r in rows})
    publish_approval(preview, rows, config, Approval.WAITING, timeout)
    logger.warning(
        "forget: %d memories in %d profile(s) would be deleted (see the %s artifact); "
        "waiting up to %d s for approval: Resume the run in the Prefect UI%s, or "
        "`reverie approve %s` (--reject to delete none)",
        len(rows), profiles, APPROVAL_ARTIFACT, timeout, _ui_link(), run_id,
    )
    form = DeletionApproval.with_initial_data(description=approval_form(rows, config))
    try:
        answer = pause_flow_run(wait_for_input=form, timeout=timeout,
                                poll_interval=min(APPROVAL_POLL_SECONDS, timeout))
    except FlowPauseTimeout:
        publish_approval(preview, rows, config, Approval.TIMED_OUT, timeout)
        logger.warning("forget: no approval within %d s: nothing deleted, nothing archived",
                       timeout)
        message = (f"forget: no approval within {timeout} s; nothing was deleted or "
                   "archived (the next run asks again)")
        _state_says(run_id, message)
        raise ReverieError(message) from None
    outcome = Approval.APPROVED if answer.approve else Approval.REJECTED
    publish_approval(preview, rows, config, outcome, timeout, answer.reason)
    if answer.approve:
        logger.info("forget: deletion of %d memories approved%s", len(rows),
                    f" ({answer.reason})" if answer.reason else "")
    else:
        logger.warning("forget: deletion rejected%s; deleting none, archiving as configured",
                       f" ({answer.reason})" if answer.reason else "")
    return answer


def approval_form(rows: Sequence[dict[str, Any]], config: ConsolidationConfig) -> str:
    """What the UI's Resume form says above its fields."""
    profiles = len({r["profile"] for r in rows})
    return (
        f"**{len(rows)} memories in {profiles} profile(s) would be deleted** "
        f"({_deletion_rule(config)}); they are listed in the "
        f"`{APPROVAL_ARTIFACT}` artifact.\n\n"
        "Set **approve** to delete exactly those (tombstones are kept); leave it false to "
        "delete none: archiving goes ahead either way."
    )


def approval_markdown(
    preview: RunReport, rows: Sequence[dict[str, Any]], config: ConsolidationConfig,
    state: Approval, timeout: int, reason: str = "",
) -> str:
    """The forget-approval artifact: what would be deleted, per profile and one by one
    (content as the steps' previews only), and where the approval stands."""
    thresholds = config.forget
    outcome = {
        Approval.WAITING: f"waiting for approval (at most {timeout} s): Resume the run "
        f"in the Prefect UI, or `reverie approve {preview.run_id}` (`--reject` deletes none)",
        Approval.APPROVED: "approved: the memories listed are deleted",
        Approval.REJECTED: "rejected: none deleted; archiving went ahead",
        Approval.TIMED_OUT: f"no answer within {timeout} s: nothing deleted, nothing "
        "archived; the run failed",
    }.get(state, state.value)
    lines = [
        "# Forget: deletion needs approval", "",
        f"**As of:** {preview.as_of} UTC  ",
        f"**Rule:** {_deletion_rule(config)}; archive "
        + (f"at risk >= {thresholds.risk_archive_at:g}" if thresholds.policy == "risk"
           else f"below relevance {thresholds.archive_threshold:g}") + "  ",
        f"**Would delete:** {len(rows)} memories in "
        f"{len({r['profile'] for r in rows})} profile(s)  ",
        f"**Approval:** {outcome}" + (f" ({_cell(reason)})" if reason else ""),
        "", "| profile | delete | archive | protected |", "|---|---:|---:|---:|",
    ]
    steps = [s for s in preview.steps if s.facts.get("deleted")]
    for s in steps[:APPROVAL_PROFILES]:
        lines.append(f"| {_cell(s.profile)} | {s.facts['deleted']} | "
                     f"{s.facts.get('archived', 0)} | {s.facts.get('protected', 0)} |")
    if len(steps) > APPROVAL_PROFILES:
        lines.append(f"\n... and {len(steps) - APPROVAL_PROFILES} more profiles")
    lines += ["", "| profile | id | external id | kind | relevance | content |",
              "|---|---|---|---|---:|---|"]
    for r in rows[:APPROVAL_ROWS]:
        lines.append(f"| {_cell(r['profile'])} | `{r['id']}` | {_cell(r['external_id'])} | "
                     f"{_cell(r['kind'])} | {r['relevance']:.4f} | {_cell(r['content'])} |")
    if len(rows) > APPROVAL_ROWS:
        lines.append(f"\n... and {len(rows) - APPROVAL_ROWS} more (the approval covers "
                     "them too; the forget-dry-run-deletions artifact lists more)")
    return "\n".join(lines) + "\n"


def _deletion_rule(config: ConsolidationConfig) -> str:
    """Which memories the forget policy deletes, as the approval form says it."""
    forget = config.forget
    if forget.policy == "risk":
        return f"forgetting risk at or above {forget.risk_delete_at:g}, linksee's policy"
    return f"relevance below {forget.delete_threshold:g}"


def _state_says(run_id: str | None, message: str) -> None:
    """Put ``message`` in the run's Failed state. When a pause times out, Prefect's server
    has already failed the run with its own "paused and never resumed", and refuses the
    run's own failure after it; the operator must read why (no approval) in the UI."""
    if run_id is None:
        return
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.states import Failed

    try:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(UUID(run_id), Failed(message=message), force=True)
    except Exception as exc:  # noqa: BLE001 - the log and the artifact say it already
        run_logger(log).warning("could not put the timeout in the run's state: %s", exc)


def publish_approval(
    preview: RunReport, rows: Sequence[dict[str, Any]], config: ConsolidationConfig,
    state: Approval, timeout: int, reason: str = "",
) -> None:
    """A new version of the run's forget-approval artifact."""
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(
        approval_markdown(preview, rows, config, state, timeout, reason),
        key=APPROVAL_ARTIFACT, description=f"forget: deletions {state.value}",
    )


def _cell(text: object) -> str:
    """Text safe in a markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _ui_link() -> str:
    from prefect.runtime import flow_run

    url = flow_run.ui_url
    return f" ({url})" if url else ""


