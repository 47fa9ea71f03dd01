"""Reading back what a flow run left in the Prefect API."""

from __future__ import annotations

from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId


def run_artifacts(run_id: str | None) -> list:
    """Every artifact the flow run published."""
    assert run_id is not None, "the flow did not run under Prefect"
    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(run_id)]))
        )
