"""Turn a run's report into Prefect artifacts: a markdown summary and a table of changes.

Artifacts are keyed by flow (and dry run), so the Prefect UI shows each flow's
history of reports. Memory content appears only as the steps' previews, which obey
``REVERIE_ARTIFACT_CONTENT_CHARS`` (0 hides it).
"""

from __future__ import annotations

import logging
import re

from flows.run import RunReport

# Prefect's artifact table is for reading, not for bulk data.
MAX_TABLE_ROWS = 500

log = logging.getLogger(__name__)


def artifact_key(report: RunReport, suffix: str = "") -> str:
    key = report.flow + ("-dry-run" if report.dry_run else "") + (f"-{suffix}" if suffix else "")
    return re.sub(r"[^a-z0-9-]+", "-", key.lower()).strip("-")


def markdown(report: RunReport) -> str:
    title = report.flow.replace("-", " ").capitalize()
    if report.dry_run:
        title += " (dry run: nothing written)"
    lines = [
        f"# {title}",
        "",
        f"**As of:** {report.as_of} UTC  ",
        f"**Profiles:** {', '.join(report.profiles) or 'none'}  ",
        f"**Changes:** {report.changed()}",
        *(
            [f"**Skipped (another run was consolidating them):** "
             f"{', '.join(report.skipped_profiles)}  "]
            if report.skipped_profiles else []
        ),
        "",
        "| profile | step | examined | changed | skipped | seconds |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for s in report.steps:
        lines.append(
            f"| {s.profile} | {s.step} | {s.examined} | {s.changed} | {s.skipped} "
            f"| {s.seconds:.3f} |"
        )
    for s in report.steps:
        if not (s.changes or s.notes):
            continue
        lines += ["", f"## {s.profile}: {s.step}", ""]
        lines += [f"- note: {n}" for n in s.notes]
        for c in s.changes[:20]:
            lines.append(f"- **{c.action}** `{c.target}` {c.detail}")
        if len(s.changes) > 20:
            lines.append(f"- ... and {len(s.changes) - 20} more (see the table artifact)")
    return "\n".join(lines) + "\n"


def table(report: RunReport) -> list[dict[str, str]]:
    rows = [
        {
            "profile": s.profile,
            "step": s.step,
            "action": c.action,
            "target": c.target,
            "detail": c.detail,
            "content": c.preview if c.preview is not None else "",
        }
        for s in report.steps
        for c in s.changes
    ]
    return rows[:MAX_TABLE_ROWS]


def publish(report: RunReport) -> None:
    """Create the run's artifacts when running inside a Prefect flow run."""
    if report.run_id is None:
        return
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    create_markdown_artifact(
        markdown(report), key=artifact_key(report), description=f"{report.flow} summary"
    )
    rows = table(report) or [
        {"profile": ", ".join(report.profiles), "step": "", "action": "none",
         "target": "", "detail": "nothing to change", "content": ""}
    ]
    create_table_artifact(
        rows, key=artifact_key(report, "changes"), description=f"{report.flow} changes"
    )
    named: dict[str, list[dict[str, object]]] = {}
    for step in report.steps:
        for name, table_rows in step.tables.items():
            named.setdefault(name, []).extend(table_rows)
    for name, table_rows in named.items():
        create_table_artifact(
            table_rows[:MAX_TABLE_ROWS], key=artifact_key(report, name),
            description=f"{report.flow} {name}",
        )
