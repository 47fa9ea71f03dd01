"""An alert when a Reverie run fails or crashes: a Prefect automation, kept as code.

Prefect's ``prefect.yaml`` declares deployment triggers but not automations that watch
runs, so this module owns one: ``reverie-run-failed`` fires on the Failed or Crashed
state of any run of a Reverie flow (deployed, backfilled or started by hand against
the API) and sends a notification through a block the operator made in Prefect
(Slack, e-mail, PagerDuty, a webhook...), named by ``REVERIE_ALERT_BLOCK`` as
``<block type slug>/<block name>``. With no block set the automation is inactive:
it is paused if it exists and not created otherwise. ``reverie serve`` and
``reverie alerts`` bring it in line with the setting.

The notification names the run, its state and a link; the state message (which names
the failed profiles and their errors, never memory content) is cut to 500 characters.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from reverie.models.errors import ConfigError
from reverie.models.settings import get_settings

AUTOMATION_NAME = "reverie-run-failed"
FAILED_STATES = ("prefect.flow-run.Failed", "prefect.flow-run.Crashed")
SUBJECT = "Reverie: {{ flow_run.name }} {{ flow_run.state.name | lower }}"
BODY = (
    "Run {{ flow_run.name }} of flow {{ flow.name }} ended {{ flow_run.state.name }}.\n"
    "{{ flow_run.state.message | truncate(500) }}\n"
    "{{ flow_run | ui_url }}"
)


@dataclass(frozen=True)
class AlertState:
    automation_id: UUID | None
    enabled: bool
    block: str | None


def reverie_flow_names() -> list[str]:
    from reverie.flows.catalog import FLOWS
    from reverie.orchestration.replay import FLOW_NAME as REPLAY

    return sorted({f.name for f in FLOWS.values()} | {REPLAY})


def failure_automation(block_document_id: UUID, flows: list[str]):
    """The automation: one notification per failed or crashed run of ``flows``."""
    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    return AutomationCore(
        name=AUTOMATION_NAME,
        description="A Reverie run failed or crashed (deployments/alerts.py; "
                    "REVERIE_ALERT_BLOCK names the block it notifies through).",
        enabled=True,
        trigger=EventTrigger(
            expect=set(FAILED_STATES),
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={"prefect.resource.role": "flow",
                           "prefect.resource.name": flows},
            for_each={"prefect.resource.id"},
            posture=Posture.Reactive,
            threshold=1,
            within=0,
        ),
        actions=[SendNotification(block_document_id=block_document_id, subject=SUBJECT,
                                  body=BODY)],
    )


def ensure_failure_alerts(block: str | None = None) -> AlertState:
    """Bring the automation in line with ``block`` (default ``REVERIE_ALERT_BLOCK``):
    create or update it, enabled, when a block is named; pause it when none is."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    from reverie.deployments.crash_detection import same_automation

    block = block if block is not None else get_settings().alert_block
    with get_client(sync_client=True) as client:
        existing = client.read_automations_by_name(AUTOMATION_NAME)
        if not block:
            for automation in existing:
                if automation.enabled:
                    client.pause_automation(automation.id)
            return AlertState(existing[0].id if existing else None, False, None)
        slug, _, name = block.partition("/")
        try:
            document = client.read_block_document_by_name(name, block_type_slug=slug)
        except ObjectNotFound:
            raise ConfigError(
                f"REVERIE_ALERT_BLOCK: Prefect has no {slug!r} block named {name!r}; "
                "create it (UI: Blocks) or fix the name"
            ) from None
        automation = failure_automation(document.id, reverie_flow_names())
        if existing:
            if not same_automation(existing[0], automation):
                client.update_automation(existing[0].id, automation)
            for extra in existing[1:]:
                client.delete_automation(extra.id)
            return AlertState(existing[0].id, True, block)
        return AlertState(client.create_automation(automation), True, block)
