"""Runs whose process is gone end Crashed on their own: two Prefect automations, as code.

A flow run's state lives on the server; its process reports it. When the process dies
unannounced (SIGKILL, the out-of-memory killer, its worker or machine gone) nothing
reports an end, and the run stayed ``Running`` or ``Pending`` for ever, blocking
``reverie backfill`` ("still queued or running") and the profile's next runs. Prefect's
own remedy ("detect zombie flows") is used:

- ``reverie-run-unresponsive``: a deployed run sends a ``prefect.flow-run.heartbeat``
  every ``REVERIE_HEARTBEAT_SECONDS`` while its process lives (paused for an approval
  included). Once a run is Running, a proactive trigger expects its next heartbeat (or
  its end) within ``REVERIE_UNRESPONSIVE_SECONDS``; none comes: the run is set Crashed.
  A run left Cancelling by a dead worker is not: Prefect lets Cancelling end only
  Cancelled, and its own cancellation cleanup does that after
  PREFECT_SERVER_SERVICES_CANCELLATION_CLEANUP_CANCELLING_TIMEOUT_SECONDS (300);
  tests/test_zombies.py shows it.
- ``reverie-run-not-started``: a Pending run (a worker took it and was to start its
  process) that is neither Running nor ended nor put back to wait within
  ``REVERIE_NOT_STARTED_SECONDS`` is set Crashed.

Both act only on runs tagged ``reverie`` (every deployment in prefect.yaml is), never on
other teams' runs on a shared Prefect. The Crashed state fires the failure alert
(deployments/alerts.py) like any crash. ``reverie serve`` creates them, and keeps them
in line with the settings on every start.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

UNRESPONSIVE_AUTOMATION = "reverie-run-unresponsive"
NOT_STARTED_AUTOMATION = "reverie-run-not-started"
RUN_TAG = "reverie"
HEARTBEAT = "prefect.flow-run.heartbeat"
# Every end a run reports itself. Suspended: a run paused with its process released
# sends no heartbeat and is not dead; it comes back through Pending and Running.
ENDS = ("prefect.flow-run.Completed", "prefect.flow-run.Failed",
        "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed",
        "prefect.flow-run.Suspended")
# A Pending run goes on to Running, or back to waiting (no concurrency slot yet, a
# retry, a reschedule) without being dead.
LEFT_PENDING = ("prefect.flow-run.Running", "prefect.flow-run.Scheduled",
                "prefect.flow-run.Late", "prefect.flow-run.AwaitingConcurrencySlot",
                "prefect.flow-run.AwaitingRetry", "prefect.flow-run.Cancelling", *ENDS)


@dataclass(frozen=True)
class CrashDetection:
    unresponsive: UUID
    not_started: UUID
    unresponsive_seconds: int
    not_started_seconds: int


def crash_automations(unresponsive_seconds: int, not_started_seconds: int) -> list[Any]:
    """The two automations, for these windows (a pure function of its arguments)."""
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    def crashing(name: str, description: str, after: set[str], expect: set[str],
                 within: int, message: str) -> AutomationCore:
        return AutomationCore(
            name=name,
            description=description + " (deployments/crash_detection.py)",
            enabled=True,
            trigger=EventTrigger(
                after=after,
                expect=expect,
                match={"prefect.resource.id": "prefect.flow-run.*"},
                match_related={"prefect.resource.role": "tag",
                               "prefect.resource.id": f"prefect.tag.{RUN_TAG}"},
                for_each={"prefect.resource.id"},
                posture=Posture.Proactive,
                threshold=1,
                within=timedelta(seconds=within),
            ),
            # Not forced: a run that did end meanwhile keeps its end (Prefect refuses
            # to leave a final state).
            actions=[ChangeFlowRunState(state=StateType.CRASHED, message=message)],
        )

    return [
        crashing(
            UNRESPONSIVE_AUTOMATION,
            "A Reverie run sent no heartbeat for REVERIE_UNRESPONSIVE_SECONDS: its "
            "process is gone, so the run is Crashed",
            {HEARTBEAT, "prefect.flow-run.Running"}, {HEARTBEAT, *ENDS},
            unresponsive_seconds,
            f"Crashed: no heartbeat for {unresponsive_seconds} s, its process is gone "
            "(a killed worker, flow-run process or machine)."),
        crashing(
            NOT_STARTED_AUTOMATION,
            "A Reverie run stayed Pending for REVERIE_NOT_STARTED_SECONDS: the worker "
            "that took it is gone, so the run is Crashed",
            {"prefect.flow-run.Pending"}, set(LEFT_PENDING),
            not_started_seconds,
            f"Crashed: Pending for {not_started_seconds} s, its process never started "
            "running it (its worker died)."),
    ]


def _without_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_ids(v) for k, v in value.items() if k != "id"}
    if isinstance(value, list):
        items = [_without_ids(v) for v in value]
        # Sets (a trigger's event names) come out in no set order.
        return sorted(items) if all(isinstance(v, str) for v in items) else items
    return value


def same_automation(existing: Any, wanted: Any) -> bool:
    """Whether ``existing`` (as read from Prefect) already is ``wanted``: the same
    description, switch, trigger and actions (a trigger's generated id aside)."""
    fields = {"description", "enabled", "trigger", "actions"}
    return bool(_without_ids(existing.model_dump(mode="json", include=fields))
                == _without_ids(wanted.model_dump(mode="json", include=fields)))


def ensure_crash_detection(unresponsive_seconds: int | None = None,
                           not_started_seconds: int | None = None) -> CrashDetection:
    """Create the two automations on the configured Prefect API, or bring existing ones
    in line (the windows from the settings unless given); extra copies are removed."""
    from prefect.client.orchestration import get_client

    from reverie.models.settings import get_settings

    settings = get_settings()
    unresponsive = unresponsive_seconds or settings.unresponsive_seconds
    not_started = not_started_seconds or settings.not_started_seconds
    ids: dict[str, UUID] = {}
    with get_client(sync_client=True) as client:
        for automation in crash_automations(unresponsive, not_started):
            existing = client.read_automations_by_name(automation.name)
            if existing:
                # Only when it differs: an update drops the trigger's open windows, and
                # a stack restarted after a crash would never crash the runs in flight.
                if not same_automation(existing[0], automation):
                    client.update_automation(existing[0].id, automation)
                for extra in existing[1:]:
                    client.delete_automation(extra.id)
                ids[automation.name] = existing[0].id
            else:
                ids[automation.name] = client.create_automation(automation)
    return CrashDetection(ids[UNRESPONSIVE_AUTOMATION], ids[NOT_STARTED_AUTOMATION],
                          unresponsive, not_started)
