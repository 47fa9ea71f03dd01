"""Turn a run's report into Prefect artifacts: a markdown summary, a table of changes,
a report per profile, and a progress bar while it runs.

The summary and the table are keyed by flow (and dry run), so the Prefect UI shows
each flow's history of reports; each profile's report is keyed by flow and profile
(``decay-profile-maya``), so one profile's history is one key. Changes name memories
by the id the user gave them beside Reverie's own. Memory content appears only as the
steps' previews, which obey ``REVERIE_ARTIFACT_CONTENT_CHARS`` (0 hides it).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast
from uuid import UUID

from reverie.runner.report import RunReport
from reverie.tasks.step import Change, StepReport

if TYPE_CHECKING:
    from reverie.runner.progress import Bar

# Prefect's artifact table is for reading, not for bulk data.
MAX_TABLE_ROWS = 500
# A run over thousands of profiles summarises: it names this many, and details this many.
MAX_NAMED_PROFILES = 20
MAX_LISTED_PROFILES = 100
# Profiles that get a report of their own in one run (each is an API call): those
# with changes, notes or failures first come first, by name.
MAX_PROFILE_ARTIFACTS = 100
# Changes listed in markdown, per step of a profile.
MAX_LISTED_CHANGES = 20

log = logging.getLogger(__name__)


def artifact_key(report: RunReport, suffix: str = "") -> str:
    key = report.flow + ("-dry-run" if report.dry_run else "") + (f"-{suffix}" if suffix else "")
    return _slug(key)


def profile_key(report: RunReport, profile: str) -> str:
    """The key of a profile's own report. Prefect keys allow only a-z, 0-9 and dashes:
    a name that loses characters to that gets a short digest of itself, so ``Bob``
    and ``bob`` never share a key."""
    slug = _slug(profile)
    if slug != profile:
        slug += "-" + hashlib.sha1(profile.encode()).hexdigest()[:6]
    return artifact_key(report, f"profile-{slug}")


def _cell(text: str) -> str:
    """Text safe in a markdown table cell (an error may hold a bar or a newline)."""
    return " ".join(text.split()).replace("|", "\\|")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")


def user_ids(target: str, external: Mapping[str, str]) -> str:
    """The user's ids for a change's target (a memory, or an edge ``a -> b``); empty
    when none of it has one (summaries Reverie wrote, blocks)."""
    parts = [p.strip() for p in target.split("->")]
    named = [external.get(p, "") for p in parts]
    return " -> ".join(named) if any(named) else ""


def _change_line(c: Change, external: Mapping[str, str]) -> str:
    theirs = user_ids(c.target, external)
    return f"- **{c.action}** `{c.target}`" + (f" (id `{theirs}`)" if theirs else "") + \
        f" {c.detail}"


def markdown(report: RunReport, external: Mapping[str, str] | None = None) -> str:
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
        *(["", f"**Nothing done: {report.note}.**"] if report.note else []),
        *(["", f"**A real run waits for {report.waits_for}.**"] if report.waits_for else []),
        *(
            [f"**Skipped (another run was consolidating them):** "
             f"{_names(report.skipped_profiles)}  "]
            if report.skipped_profiles else []
        ),
        *(
            ["**Waited for busy profiles:** " + ", ".join(
                f"{p} {s:.1f} s" for p, s in sorted(report.waited.items())[:MAX_NAMED_PROFILES])
             + (f" and {len(report.waited) - MAX_NAMED_PROFILES} more"
                if len(report.waited) > MAX_NAMED_PROFILES else "")
             + f" ({sum(report.waited.values()):.1f} s in all)  "]
            if report.waited else []
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
        lines += _step_details(s, external or {})
    return "\n".join(lines) + "\n"


def _step_details(s: StepReport, external: Mapping[str, str]) -> list[str]:
    lines = [f"- note: {n}" for n in s.notes]
    lines += [_change_line(c, external) for c in s.changes[:MAX_LISTED_CHANGES]]
    if len(s.changes) > MAX_LISTED_CHANGES:
        lines.append(f"- ... and {len(s.changes) - MAX_LISTED_CHANGES} more "
                     "(see the table artifact)")
    return lines


def profile_markdown(
    report: RunReport, profile: str, external: Mapping[str, str] | None = None
) -> str:
    """One profile's part of the run: its steps, what each changed and why."""
    steps = [s for s in report.steps if s.profile == profile]
    title = f"{report.flow.replace('-', ' ').capitalize()}: {profile}"
    lines = [
        f"# {title}" + (" (dry run: nothing written)" if report.dry_run else ""),
        "",
        f"**As of:** {report.as_of} UTC  ",
        f"**Changes:** {sum(s.changed for s in steps)}  ",
        *([f"**Waited for another run:** {report.waited[profile]:.1f} s  "]
          if profile in report.waited else []),
        "",
        "| step | examined | changed | skipped | seconds | error |",
        "|---|---:|---:|---:|---:|---|",
    ]
    lines += [f"| {s.step} | {s.examined} | {s.changed} | {s.skipped} | {s.seconds:.3f} "
              f"| {_cell(s.error or '')} |" for s in steps]
    for s in steps:
        details = _step_details(s, external or {})
        if details:
            lines += ["", f"## {s.step}", "", *details]
    return "\n".join(lines) + "\n"


def profiles_with_news(report: RunReport) -> list[str]:
    """Profiles whose run has something to read: a change, a note or a failure."""
    return sorted({s.profile for s in report.steps if s.changed or s.notes or s.error})


def _names(profiles: list[str]) -> str:
    if len(profiles) <= MAX_NAMED_PROFILES:
        return ", ".join(profiles)
    return f"{len(profiles)} ({', '.join(profiles[:3])}, ..., {profiles[-1]})"


def table(report: RunReport, external: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    rows = [
        {
            "profile": s.profile,
            "step": s.step,
            "action": c.action,
            "id": user_ids(c.target, external or {}),
            "target": c.target,
            "detail": c.detail,
            "content": c.preview if c.preview is not None else "",
        }
        for s in report.steps
        for c in s.changes
    ]
    return rows[:MAX_TABLE_ROWS]


def listed_targets(report: RunReport) -> list[str]:
    """Every memory id the artifacts may name (edges ``a -> b`` give both)."""
    return sorted({part.strip() for s in report.steps for c in s.changes
                   for part in c.target.split("->")})


def publish(report: RunReport, external: Mapping[str, str] | None = None) -> None:
    """Create the run's artifacts when running inside a Prefect flow run. ``external``:
    the user's id of each Reverie id it has one for."""
    if report.run_id is None:
        return
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    external = external or {}
    create_markdown_artifact(
        markdown(report, external), key=artifact_key(report),
        description=f"{report.flow} summary",
    )
    for profile in profiles_with_news(report)[:MAX_PROFILE_ARTIFACTS]:
        create_markdown_artifact(
            profile_markdown(report, profile, external), key=profile_key(report, profile),
            description=f"{report.flow} for {profile}",
        )
    rows = table(report, external) or [
        {"profile": _names(report.profiles), "step": "", "action": "none", "id": "",
         "target": "", "detail": report.note or "nothing to change", "content": ""}
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


class RunProgress:
    """A progress artifact (profiles finished out of all) while a Prefect run goes on;
    its description names the profiles being waited for and who holds them.

    A run of several profiles with a terminal on stderr, which is a command running the
    flow in its own process (``reverie consolidate full --all``), also gets a bar there.
    A run on a worker or a runner has none: Prefect reads its output through a pipe.
    """

    def __init__(self, report: RunReport) -> None:
        self.report = report
        self.artifact_id: UUID | None = None
        self.shown: tuple[float, str] = (-1.0, "")
        self.bar = self._terminal_bar()
        if report.run_id is None or not report.profiles:
            return
        from prefect.artifacts import create_progress_artifact

        # Called from sync code, Prefect's dual sync/async function returns the id itself.
        self.artifact_id = cast(UUID, create_progress_artifact(
            0.0, key=artifact_key(report, "progress"), description=self._describe({})))

    def update(self, done: int, waiting: dict[str, str]) -> None:
        if self.bar is not None:
            # A count only: profiles' names stay off the terminal (the artifact has them).
            self.bar.describe(f"waiting for {len(waiting)} busy" if waiting else "")
            self.bar.advance_to(done)
        if self.artifact_id is None:
            return
        from prefect.artifacts import update_progress_artifact

        progress = round(100.0 * done / max(len(self.report.profiles), 1), 1)
        description = self._describe(waiting)
        # At most ~100 updates, however many profiles: each is an API call.
        if progress - self.shown[0] >= 1.0 or description != self.shown[1] or progress >= 100:
            update_progress_artifact(self.artifact_id, progress, description=description)
            self.shown = (progress, description)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _terminal_bar(self) -> Bar | None:
        """A bar over the run's profiles on this process's terminal, or None (for one
        profile a bar of one would only flash at the end)."""
        if len(self.report.profiles) < 2:
            return None
        from reverie.runner.progress import Bar

        bar = Bar(len(self.report.profiles), self.report.flow, unit="profile")
        return bar if bar.active else None

    def _describe(self, waiting: dict[str, str]) -> str:
        text = f"{self.report.flow}: profiles finished, of {len(self.report.profiles)}"
        if waiting:
            shown = sorted(waiting.items())[:5]
            text += "; waiting for " + "; ".join(f"{p} (held by {h})" for p, h in shown)
            if len(waiting) > 5:
                text += f" and {len(waiting) - 5} more"
        return text
