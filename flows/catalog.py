"""Every flow by the short name the CLI and backfills use: the one registry of flows.

A flow is imported when it is first looked up: declaring one makes Prefect build the
JSON schema of its parameters (about 80 ms each), and a command runs one flow, not
nine.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from reverie.models.errors import ConfigError

if TYPE_CHECKING:
    from prefect import Flow

    from reverie.runner.report import RunReport


class FlowCatalog(Mapping[str, "Flow[..., RunReport]"]):
    """Short name → flow, each imported on lookup (the module's attribute is read every
    time, so a test that replaces it is seen)."""

    def __init__(self, where: dict[str, str]) -> None:
        self._where = where

    def __getitem__(self, name: str) -> Flow[..., RunReport]:
        module, _, attribute = self._where[canonical(name)].partition(":")
        flow: Flow[..., RunReport] = getattr(importlib.import_module(module), attribute)
        return flow

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


class Command(StrEnum):
    """The CLI command that runs a flow: ``reverie consolidate NAME`` or ``reverie run NAME``."""

    CONSOLIDATE = "consolidate"
    RUN = "run"


@dataclass(frozen=True, slots=True)
class FlowEntry:
    """One flow, as every list of flows names it (CLI, backfill, replay, bench, status,
    alerts, prefect.yaml's check and the README's table are made from these)."""

    name: str  # the short name: CLI, backfill, replay, bench
    target: str  # "module:attribute" of the Prefect flow
    flow_name: str  # the Prefect flow's name
    command: Command
    steps: tuple[str, ...]  # its steps, in an order its DAG allows
    when: str  # when it runs, as deployed
    summary: str  # one line: the CLI's help
    changes: str = ""  # what it changes, for the README's table of maintenance flows
    deployment: str | None = None  # its scheduled (or on-demand) deployment in prefect.yaml
    dag: str = ""  # its DAG as the README draws it (default: the steps in a row)

    def drawn(self) -> str:
        return self.dag or " → ".join(self.steps)


# In the order a day's schedules first run them: decay at 02:00 before the nightly full
# consolidation at 03:00, and so on (the bench runs them in this order too).
FLOW_ENTRIES: tuple[FlowEntry, ...] = (
    FlowEntry(
        "decay", "reverie.flows.decay:decay", "decay", Command.RUN, ("decay",), "daily",
        "Recompute every live hot memory's relevance at as_of.",
        "each live hot memory's `relevance` = exp(-0.01·age) · access · (1 + 0.3·ln(1 + "
        "links)) · (0.5 + importance) · (0.7 + 0.3·confidence), capped at 1; publishes the "
        "high/medium/low/archive distribution",
        deployment="decay/daily"),
    FlowEntry(
        "full", "reverie.flows.full_consolidation:full_consolidation", "full-consolidation",
        Command.CONSOLIDATE,
        ("dedup", "compress_fading", "dedup_new_summaries", "compile_blocks", "promote",
         "decay_edges", "link_summaries", "graph_importance"),
        "nightly, at session end",
        "Merge near-duplicates, compress fading memories, link, score and compile Core "
        "Memory.", deployment="full-consolidation/nightly"),
    FlowEntry(
        "lightweight", "reverie.flows.lightweight_consolidation:lightweight_consolidation",
        "lightweight-consolidation", Command.CONSOLIDATE, ("compile_blocks", "decay_edges"),
        "every 50 stores, when idle", "Compile Core Memory blocks and decay old edges.",
        deployment="lightweight-consolidation/on-demand"),
    FlowEntry(
        "creative", "reverie.flows.creative:creative", "creative", Command.RUN, ("creative",),
        "weekly", "Discover typed edges within a reproducible sample of relevant memories.",
        "typed edges (`contradicts`, `discovered` explains / shares_theme / "
        "parallel_context) within a sample of 20 relevant memories, drawn reproducibly from "
        "profile and `as_of`", deployment="creative/weekly"),
    FlowEntry(
        "cluster", "reverie.flows.cluster:cluster", "cluster", Command.RUN, ("cluster",),
        "monthly", "Describe each cluster of similar relevant memories with a meta-memory.",
        "one meta-memory per group of >= 5 similar memories (cosine >= 0.75; connected "
        "components, or Leiden with `config.cluster.method = \"leiden\"`), with "
        "`summarizes` edges; a later run updates it in place", deployment="cluster/monthly"),
    FlowEntry(
        "compress", "reverie.flows.compress:compress", "compress", Command.RUN,
        ("compress_fading",), "(in full)",
        "Compress groups of fading memories into dated summaries (full does it too).",
        "on its own: groups of 5 fading memories (relevance < 0.20, cosine >= 0.70 to "
        "the group's seed, same kind and entity; never a summary) become one summary dated "
        "as_of, its members' dates in its words and in `members_from`, `members_until`, "
        "`member_dates`: max importance, mean stability, max access count, a fresh "
        "embedding, provenance links of weight 0.8"),
    FlowEntry(
        "cold-notes", "reverie.flows.cold_notes:consolidate_cold", "consolidate-cold",
        Command.RUN, ("consolidate_cold", "forget", "mark_stalled"), "session end, on demand",
        "Turn old context notes into learnings, sweep, and mark stalled work.",
        "per (entity, layer), >= 2 unprotected context/emotion/implementation notes at "
        "least 7 days old with heat < 30 become one protected learning memory that says "
        "every note whole, by day (linksee's top 3 exemplars, the period, count and "
        "replaced ids in its metadata); then the forget sweep and `in_progress` "
        "untouched for 30 days → `stalled`. `scope` all or one session, `min_age_days` (0 "
        "after a bulk import)", deployment="consolidate-cold/sleep"),
    FlowEntry(
        "forget", "reverie.flows.forget:forget", "forget", Command.RUN, ("forget",), "off",
        "Archive or delete what the operator allows (deletion needs approval).",
        "archives below `archive_threshold`, deletes below `delete_threshold` (both 0.0 = "
        "off; set them as the flow's parameters, with `--archive-below`/`--delete-below`, "
        "or the preset `archive-faded`); a block quoting a forgotten memory is compiled "
        "again without it in the same transaction", deployment="forget/operator"),
    FlowEntry(
        "cold-tier", "reverie.flows.cold_tier:cold_tier", "cold-tier", Command.RUN,
        ("migrate_cold", "expire_cold"), "off",
        "Move unused memories to the cold tier and expire old cold ones (TTL).",
        "cognitive-memory's cold migration and cold TTL: live memories unused for "
        "`migrate_after_days` or more (since the last access, or creation) move to the "
        "cold tier, then memories cold for `ttl_days` or more become tombstones (both "
        "empty = off; cognitive-memory's numbers are 7 and 180); set them in "
        "`config.cold_tier`, as the flow's parameters, or with "
        "`--migrate-after-days`/`--ttl-days`", deployment="cold-tier/tiering"),
)
ENTRIES: dict[str, FlowEntry] = {e.name: e for e in FLOW_ENTRIES}
# Old short names, still accepted for one release (the next one drops them): "cold" named
# the cold notes, and read as the cold tier too. The Prefect flow and deployment keep
# their names (consolidate-cold/sleep), so deployments and run history are untouched.
ALIASES: dict[str, str] = {"cold": "cold-notes"}
FLOWS = FlowCatalog({e.name: e.target for e in FLOW_ENTRIES})
# Short names of the flows each command runs, in the registry's order.
CONSOLIDATION_MODES = tuple(e.name for e in FLOW_ENTRIES if e.command is Command.CONSOLIDATE)
RUN_TASKS = tuple(e.name for e in FLOW_ENTRIES if e.command is Command.RUN)
MAINTENANCE = ("decay", "creative", "cluster", "forget")
# The deployment (in prefect.yaml) that runs each flow on a work pool.
DEPLOYMENTS: dict[str, str] = {e.name: e.deployment for e in FLOW_ENTRIES if e.deployment}
# Prefect's names of the flows.
FLOW_NAMES = tuple(e.flow_name for e in FLOW_ENTRIES)


# Where each flow comes in a day's schedules: on one as_of, a backfill runs its flows in
# this order (decay before full consolidation), as the schedules would have.
SCHEDULE_ORDER: dict[str, int] = {e.name: i for i, e in enumerate(FLOW_ENTRIES)}


def canonical(name: str) -> str:
    """A short name as the registry spells it: an old name (``ALIASES``) gives its new one."""
    return ALIASES.get(name, name)


def parse_flows(text: str) -> tuple[str, ...]:
    """``"full,decay"`` as the flows it names, in schedule order, each once; an old name
    counts as its new one; an unknown name is refused with the known ones."""
    names = [canonical(n.strip()) for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENTRIES]
    if unknown or not names:
        raise ConfigError(f"unknown flow {(unknown or [text])[0]!r}; choose one of "
                          f"{', '.join(sorted(ENTRIES))} (several joined by commas)")
    return tuple(sorted(set(names), key=SCHEDULE_ORDER.__getitem__))


def names_help() -> str:
    """The short names, for a help text."""
    return ", ".join(ENTRIES)


def aliases_help() -> str:
    """The old names still accepted, for a help text."""
    return "; ".join(f"{old}: old name of {new}, accepted until the next release"
                     for old, new in ALIASES.items())


def flow_table() -> str:
    """The README's table of the flows ``reverie run`` runs."""
    rows = ["| flow | DAG | when | what it changes |", "|---|---|---|---|"]
    rows += [f"| `{e.flow_name}` | `{e.drawn()}` | {e.when} | {e.changes} |"
             for e in FLOW_ENTRIES if e.command is Command.RUN]
    return "\n".join(rows)
