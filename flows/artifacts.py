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
# A run over thousands of profiles summarises: it names this many, and details this many.
MAX_NAMED_PROFILES = 20
MAX_LISTED_PROFILES = 100

log = logging.getLogger(__name__)


def artifact_key(report: RunReport, suffix: str = "") -> str:
    key = report.flow + ("-dry-run" if report.dry_run else "") + (f"-{suffix}" if suffix else "")
    return re.sub(r"[^a-z0-9-]+", "-", key.lower()).strip("-")


def markdown(report: RunReport) -> str:
    title = report.flow.replace("-", " ").capitalize()
    if report.dry_run:
        title += " (dry run: nothing written)"
    failed = report.failed()
    lines = [
        f"# {title}",
        "",
        f"**As of:** {report.as_of} UTC  ",
        f"**Profiles:** {_names(report.profiles) or 'none'}  ",
        f"**Changes:** {report.changed()}",
        *(
            [f"**Skipped (another run was consolidating them):** "
             f"{_names(report.skipped_profiles)}  "]
            if report.skipped_profiles else []
        ),
    ]
    if failed:
        lines += [
            "", f"## Failed: {len(failed)} profile(s)", "",
            "Every other profile finished and is recorded. Re-run the flow for these "
            "(`--profile` once for each):", "",
        ]
        lines += [f"- `{p}`: {'; '.join(errors)}" for p, errors in
                  sorted(failed.items())[:MAX_LISTED_PROFILES]]
        if len(failed) > MAX_LISTED_PROFILES:
            lines.append(f"- ... and {len(failed) - MAX_LISTED_PROFILES} more")
    lines += [
        "", "| step | profiles | examined | changed | failed | seconds |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    totals: dict[str, list[float]] = {}
    for s in report.steps:
        row = totals.setdefault(s.step, [0, 0, 0, 0, 0.0])
        for i, value in enumerate((1, s.examined, s.changed, s.error is not None, s.seconds)):
            row[i] += value
    for step, (n, examined, changed, errors, seconds) in totals.items():
        lines.append(f"| {step} | {n:.0f} | {examined:.0f} | {changed:.0f} | {errors:.0f} "
                     f"| {seconds:.3f} |")
    lines += [
        "",
        "| profile | step | examined | changed | skipped | seconds |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for s in report.steps[:MAX_TABLE_ROWS]:
        lines.append(
            f"| {s.profile} | {s.step} | {s.examined} | {s.changed} | {s.skipped} "
            f"| {s.seconds:.3f} |"
        )
    if len(report.steps) > MAX_TABLE_ROWS:
        lines.append(f"\n... and {len(report.steps) - MAX_TABLE_ROWS} more rows (totals above)")
    sections = [s for s in report.steps if s.changes or s.notes][:MAX_LISTED_PROFILES]
    for s in sections:
        lines += ["", f"## {s.profile}: {s.step}", ""]
        lines += [f"- note: {n}" for n in s.notes]
        for c in s.changes[:20]:
            lines.append(f"- **{c.action}** `{c.target}` {c.detail}")
        if len(s.changes) > 20:
            lines.append(f"- ... and {len(s.changes) - 20} more (see the table artifact)")
    return "\n".join(lines) + "\n"


def _names(profiles: list[str]) -> str:
    if len(profiles) <= MAX_NAMED_PROFILES:
        return ", ".join(profiles)
    return f"{len(profiles)} ({', '.join(profiles[:3])}, ..., {profiles[-1]})"


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
        {"profile": _names(report.profiles), "step": "", "action": "none",
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
