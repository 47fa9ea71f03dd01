"""The ``reverie`` command.

Heavy libraries (Prefect, sentence-transformers) are imported inside the commands
that need them, so ``reverie get`` or ``reverie export`` answer at once.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from reverie.flows.catalog import (
    CONSOLIDATION_MODES,
    ENTRIES,
    RUN_TASKS,
    aliases_help,
    canonical,
    names_help,
)
from reverie.models.config import ConsolidationConfig
from reverie.models.errors import ReverieError
from reverie.models.ids import given_id
from reverie.models.store import Store
from reverie.models.tables import Memory, Tombstone
from reverie.models.timestamps import parse_timestamp

if TYPE_CHECKING:
    from reverie.runner.report import RunReport

EXIT_OK, EXIT_REJECTED, EXIT_ERROR = 0, 1, 2
# Decisions `reverie consolidations` shows without --limit or --all.
CONSOLIDATIONS_SHOWN = 50


def main(argv: Sequence[str] | None = None) -> int:
    # A temporary Prefect server started for a local command would try to send usage
    # analytics, and log an ERROR when the machine has no route out.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.verbose:
        # Prefect's console shows warnings only; its run logs still reach the server (the
        # UI shows them). Read when Prefect is first imported, which no command has yet.
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    try:
        return int(args.handler(args) or EXIT_OK)
    except ReverieError as exc:
        print(f"reverie: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


class _Parser(argparse.ArgumentParser):
    """argparse, with a user error as one line (and exit code 2), not the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"{self.prog}: {message} (--help for usage)\n")


def _timestamp(text: str) -> datetime:
    try:
        return parse_timestamp(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO-8601 date or date-time (e.g. 2025-07-01 or "
            "2025-07-01T03:00:00Z)") from None


def _name(text: str) -> str:
    """A profile, session or memory id from the command line, in the form the store
    keeps names in (``ids.given_id``): flows are handed profile names, and refuse one
    in another Unicode form than they are stored in."""
    try:
        return given_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("reverie")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="reverie", description="Memory consolidation for AI agents.")
    parser.add_argument("--version", action="version", version=f"reverie {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show Prefect's logs of the runs (the UI always has them)")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, handler: Callable[[argparse.Namespace], int | None], help_: str):
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(handler=handler)
        return p

    p = command("ingest", _ingest, "Store the memories (and edges) of a JSONL file.")
    p.add_argument("file", type=Path)
    p.add_argument("--profile", type=_name, help="profile for records that do not name one")
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = command("init", _init, "Create the configured store (REVERIE_DATABASE_URL) if it "
                "is not there, and print its id. Only init, ingest and demo create stores.")
    p.add_argument("--json", action="store_true")

    p = command("consolidate", _consolidate, "Run full or lightweight consolidation.")
    p.add_argument("mode", choices=CONSOLIDATION_MODES, help=_flows_help(CONSOLIDATION_MODES))
    _add_run_options(p)

    p = command("run", _run, "Run a maintenance flow.")
    # An old name is read as its new one before argparse checks the choices.
    p.add_argument("task", type=canonical, choices=RUN_TASKS,
                   help=f"{_flows_help(RUN_TASKS)}; {aliases_help()}")
    _add_run_options(p)
    p.add_argument("--scope", choices=["all", "session"],
                   help="cold-notes: all memories or a session's")
    p.add_argument("--session", type=_name, help="cold-notes: the session for --scope session")
    p.add_argument("--min-age-days", type=float,
                   help="cold-notes: minimum age (default 7; 0 allowed)")
    p.add_argument("--archive-below", type=float, metavar="RELEVANCE",
                   help="forget, cold-notes: archive memories whose relevance is below this")
    p.add_argument("--delete-below", type=float, metavar="RELEVANCE",
                   help="forget, cold-notes: delete (leaving a tombstone) below this")
    p.add_argument("--approve-deletion", action="store_true",
                   help="forget: delete without pausing for approval (required when "
                        "deletion is configured and no PREFECT_API_URL is set); cold-notes: "
                        "let the sweep delete (unapproved, it archives only); cold-tier: "
                        "let TTL expiry delete (unapproved, it lists only)")
    p.add_argument("--migrate-after-days", type=float, metavar="DAYS",
                   help="cold-tier: move memories unused this many days to the cold tier")
    p.add_argument("--ttl-days", type=float, metavar="DAYS",
                   help="cold-tier: expire memories cold this many days (with "
                        "--approve-deletion)")

    p = command("approve", _approve, "Answer a forget run paused for deletion approval.")
    p.add_argument("run_id", help="the paused flow run's id")
    p.add_argument("--reject", action="store_true",
                   help="delete none (the run still archives as configured)")
    p.add_argument("--reason", default="", help="why, kept in the run's log and artifact")

    p = command("backfill", _backfill, "Run a flow once per date over a range (resumable).")
    p.add_argument("flow", help=f"{names_help()}; or several joined by commas (decay,full), "
                   f"run on each date in the order a day's schedules run them ({aliases_help()})")
    p.add_argument("--from", dest="start", required=True, type=_timestamp,
                   help="first as_of, ISO-8601")
    p.add_argument("--to", dest="end", required=True, type=_timestamp,
                   help="last as_of, ISO-8601 (included)")
    p.add_argument("--every", default="1d", help="step between dates: 30m, 12h, 1d, 1w")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--profile", type=_name, action="append",
                       help="a profile (repeat for several)")
    group.add_argument("--all", action="store_true", help="every profile in the store")
    p.add_argument("--wait", action="store_true",
                   help="through Prefect: wait until its replay runs have ended (exit 1 if "
                   "any did not complete)")
    p.add_argument("--json", action="store_true")

    p = command("server", _server, "The local Prefect server that local commands share.")
    p.add_argument("action", choices=["status", "stop"])

    p = command("status", _status, "Last run and next scheduled run of every flow, per profile.")
    p.add_argument("--profile", type=_name, help="one profile (default: all)")
    p.add_argument("--limit", type=int, default=20, help="runs of history to show (default 20)")
    p.add_argument("--json", action="store_true")

    p = command("session-end", _session_end, "Record the end of a profile's session.")
    p.add_argument("--profile", type=_name, required=True)
    p.add_argument("--session", type=_name, help="the session's id")

    p = command("events", _events, "Prefect events waiting in the store, per profile "
                "(`reverie events flush` sends them).")
    p.add_argument("--json", action="store_true")
    events_sub = p.add_subparsers(dest="events_command")
    f = events_sub.add_parser(
        "flush", help="send the waiting events to the Prefect API now",
        description="Send the waiting events to the Prefect API ($PREFECT_API_URL), oldest "
                    "first. Exit code 0 once none is left.")
    f.add_argument("--timeout", type=float, default=30.0,
                   help="seconds to keep sending, to wait for another sender and to try again "
                        "while the API does not answer (default 30)")
    f.add_argument("--json", action="store_true")
    f.set_defaults(handler=_events_flush)

    p = command("undo", _undo, "Undo a consolidation: its originals return, its summary goes.")
    p.add_argument("id", type=_name,
                   help="a consolidation id (c-...) or the id of the summary it made")
    p.add_argument("--profile", type=_name, required=True,
                   help="the profile the consolidation belongs to")
    p.add_argument("--json", action="store_true")

    p = command("consolidations", _consolidations,
                "List a profile's consolidation decisions, newest first, each with its "
                "summary's text and why its members were grouped.")
    p.add_argument("--profile", type=_name, required=True)
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--limit", type=_count, metavar="N",
                       help=f"show the newest N (default {CONSOLIDATIONS_SHOWN})")
    shown.add_argument("--all", action="store_true", help="show every decision")
    p.add_argument("--why", action="store_true",
                   help="also the rule that grouped each decision's members and each "
                        "member's similarity (or heat) to the group")
    p.add_argument("--json", action="store_true",
                   help="print {profile, total, shown, consolidations: [...]} as JSON, "
                        "each decision with its summary_text and parameters (rule, "
                        "similarities)")

    p = command("blocks", _blocks, "Show a profile's Core Memory blocks.")
    p.add_argument("--profile", type=_name, required=True)
    p.add_argument("--json", action="store_true")

    p = command("recall", _recall, "Find the memories most similar to a query.")
    p.add_argument("query")
    p.add_argument("--profile", type=_name, required=True)
    p.add_argument("-k", type=int, default=5, help="how many memories (default 5)")
    p.add_argument("--deep", action="store_true", help="search the cold tier too")
    p.add_argument("--track", action="store_true", help="count the hits as accessed")
    p.add_argument("--json", action="store_true")

    p = command("get", _get, "Show one memory (any tier) or its tombstone.")
    p.add_argument("id", type=_name, help="a Reverie id or your own external id")
    p.add_argument("--profile", type=_name,
                   help="needed when an external id exists in several profiles")
    p.add_argument("--json", action="store_true")

    p = command("export", _export, "Back up a profile as JSONL (`reverie ingest` restores "
                "it), or dump it in canonical form to compare states.")
    p.add_argument("--profile", type=_name, required=True)
    p.add_argument("--output", type=Path, help="file to write (default: standard output)")
    p.add_argument("--canonical", action="store_true",
                   help="the comparison form: vectors as hashes, no run history")
    p.add_argument("--with-run-ids", action="store_true",
                   help="--canonical: include Prefect run ids")

    p = command("bench", _bench, "Measure what consolidation does to a store.")
    bench = p.add_subparsers(dest="bench", required=True)
    b = bench.add_parser(
        "locomo", help="answers still found after consolidation, on a LoCoMo-format file"
    )
    b.add_argument("path", type=Path)
    b.add_argument("--as-of-offset-days", type=float, default=90.0,
                   help="consolidate this long after the last session (default 90)")
    b.add_argument("--budget", type=int, default=2000, help="context characters (default 2000)")
    b.add_argument("--conversations", type=_names, metavar="ID[,ID]",
                   help="only these conversations, by sample id (e.g. one fold's two "
                        "tuning conversations, or its third to validate on; default all)")
    b.add_argument("--summarizer", default="auto", help="rules, llm or auto (default)")
    b.add_argument("--preset", help="configuration preset (default: 'default')")
    b.add_argument("--json", type=Path, dest="json_out", help="also write the result as JSON")
    b = bench.add_parser(
        "updates", help="update chains: does hot recall answer with the newest value?"
    )
    b.add_argument("--profiles", type=int, default=8,
                   help="profiles, each with one chain per fact kind (default 8)")
    b.add_argument("--as-of-offset-days", type=float, default=90.0,
                   help="consolidate this long after the last memory (default 90)")
    b.add_argument("--summarizer", default="auto", help="rules, llm or auto (default)")
    b.add_argument("--preset", help="configuration preset (default: 'default')")
    b.add_argument("--json", type=Path, dest="json_out", help="also write the result as JSON")
    b = bench.add_parser(
        "synthetic", help="time every step and flow on generated stores of chosen sizes"
    )
    b.add_argument("--sizes", type=_sizes, default=[1000, 10_000],
                   help="memories per store, comma-separated (default 1000,10000)")
    b.add_argument("--profiles", type=int, default=1, help="profiles to spread them over")
    b.add_argument("--duplicate-share", type=float, default=0.10,
                   help="share of memories in near-duplicate groups (default 0.1)")
    b.add_argument("--embeddings", choices=["random", "real"], default="random",
                   help="clustered synthetic vectors (default) or the real model's")
    b.add_argument("--ingest-sentences", type=int, default=2048,
                   help="sentences for ingest vs raw model throughput (0 skips it)")
    b.add_argument("--no-flows", dest="flows", action="store_false",
                   help="time the steps only, not the flows through Prefect")
    b.add_argument("--no-baseline", dest="checks", action="store_false",
                   help="skip the exact baseline and recall checks")
    b.add_argument("--no-steps", dest="step_rows", action="store_false",
                   help="skip the per-step rows (flows and their work only)")
    b.add_argument("--flow-list", type=_flow_list, default=None, metavar="FLOWS",
                   help="flows to time, comma-separated (default: all)")
    b.add_argument("--server", action="store_true",
                   help="run the flows through a real Prefect server started for the bench "
                        "(its database: $PREFECT_API_DATABASE_CONNECTION_URL, else SQLite)")
    b.add_argument("--database-url", metavar="URL",
                   help="keep the stores on this PostgreSQL server, one database each, "
                        "dropped at the end; its role must be allowed to CREATE DATABASE "
                        "(default: SQLite files in a temporary folder)")
    b.add_argument("--json", type=Path, dest="json_out", help="write the results as JSON")
    b.add_argument("--markdown", type=Path, help="write the results table as markdown")
    b = bench.add_parser(
        "api", help="the agent HTTP API from outside: recall and store latency and "
                    "throughput with concurrent clients"
    )
    b.add_argument("--sizes", type=_sizes, default=[1000, 10_000],
                   help="memories per profile, comma-separated (default 1000,10000)")
    b.add_argument("--clients", type=_sizes, default=[1, 8, 32],
                   help="concurrent clients, comma-separated (default 1,8,32)")
    b.add_argument("--profiles", type=int, default=2, help="profiles in the store (default 2)")
    b.add_argument("--requests", type=int, default=160,
                   help="recall calls per row (default 160)")
    b.add_argument("--store-requests", type=int, default=64,
                   help="store calls per row (default 64)")
    b.add_argument("--store-batch", type=int, default=16,
                   help="sentences per store call (default 16)")
    b.add_argument("--ingest-sentences", type=int, default=2048,
                   help="sentences for ingest's in-process throughput, store's yardstick "
                        "(0 skips it)")
    b.add_argument("--json", type=Path, dest="json_out", help="write the results as JSON")
    b.add_argument("--markdown", type=Path, help="write the results table as markdown")
    b = bench.add_parser(
        "embedding", help="OpenVINO against PyTorch embeddings: speed and closeness, same run"
    )
    b.add_argument("--locomo", type=Path, default=None,
                   help="a LoCoMo-format file: its turns, summaries of them, and every "
                        "sentence compared (default: synthetic sentences only)")
    b.add_argument("--sentences", type=int, default=2048,
                   help="synthetic sentences per workload and for the ingest (default 2048)")
    b.add_argument("--json", type=Path, dest="json_out", help="also write the rows as JSON")

    p = command("alerts", _alerts, "Announce failed and crashed Reverie runs through a "
                "Prefect notification block (the reverie-run-failed automation).")
    p.add_argument("--block", metavar="TYPE/NAME",
                   help="the block, e.g. slack-webhook/ops (default $REVERIE_ALERT_BLOCK)")
    p.add_argument("--off", action="store_true", help="pause the automation")

    p = command("serve", _serve, "Run a Prefect server, deploy every flow and start a worker "
                "(Prefect's database: $PREFECT_API_DATABASE_CONNECTION_URL, else SQLite).")
    p.add_argument("--port", type=int, default=4200)
    p.add_argument("--home", type=Path, help="Prefect's own folder (default .reverie/prefect)")

    p = command("api", _api, "Serve the agent HTTP API (JSON endpoints, OpenAPI at "
                "/openapi.json, MCP at /mcp); tokens: REVERIE_API_TOKENS, "
                "REVERIE_API_ADMIN_TOKEN or REVERIE_API_TOKENS_BLOCK.")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765)")

    p = command("mcp", _mcp, "Serve Reverie's tools over MCP: stdio for a local agent "
                "(token: REVERIE_MCP_TOKEN), or streamable HTTP at /mcp.")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="http: address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="http: port (default 8765)")

    p = command("demo", _demo, "Ingest the bundled sample store and consolidate it.")
    p.add_argument("--database", type=Path, help="SQLite file for the demo store")
    return parser


def _flows_help(names: Sequence[str]) -> str:
    """What each of the flows does, for a command's help (argparse joins the lines)."""
    return "; ".join(f"{n}: {ENTRIES[n].summary.rstrip('.')}" for n in names)


def _flow_list(text: str) -> list[str]:
    names = [canonical(n.strip()) for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("--flow-list names no flow")
    return names


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """What every flow run takes: which profiles, its 'now', dry run, and knobs."""
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--profile", type=_name, action="append",
                       help="a profile (repeat for several)")
    group.add_argument("--all", action="store_true", help="every profile in the store")
    p.add_argument("--as-of", type=_timestamp,
                   help="the 'now' of the run, ISO-8601 (default: now)")
    p.add_argument("--dry-run", action="store_true", help="report what would change; write nothing")
    p.add_argument("--preset", help="configuration preset (default: REVERIE_PRESET or 'default')")
    p.add_argument("--not-done", action="store_true",
                   help="only the selected profiles this flow has not finished for --as-of "
                        "(re-run after some profiles failed)")
    p.add_argument("--json", action="store_true")


def _store() -> Store:
    """The configured store, which must exist: reading a SQLite store that is not there
    would silently create an empty one (say, run from another folder). Opening it
    raises StoreMissingError anyway (``models.db``); this says so before any work."""
    from reverie.models.db import _missing

    store = Store()
    if not store.exists():
        raise _missing(store.url)
    return store


def _say_created(store: Store) -> None:
    from reverie.models.settings import display_url

    print(f"created a new store at {display_url(store.url)} (id {store.id})",
          file=sys.stderr, flush=True)


def _selected(args: argparse.Namespace) -> str | list[str] | None:
    if args.all:
        return None
    return args.profile[0] if len(args.profile) == 1 else list(args.profile)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


# --- commands -------------------------------------------------------------------------


def _ingest(args: argparse.Namespace) -> int:
    from reverie.models.backup import is_backup

    if not args.file.is_file():
        raise ReverieError(f"no such file: {args.file}")
    if is_backup(args.file):
        return _restore(args)
    from reverie.engines.embedding import embedder_for
    from reverie.models.ingest import ingest_jsonl
    from reverie.runner.event_delivery import deliver, wanted
    from reverie.runner.progress import Bar, on_terminal

    store = Store()
    embedder = embedder_for(store.settings)

    total = None
    if on_terminal():
        # Counted first for the bar alone (a quick pass): with its total it says how far
        # the ingest is and how long the rest takes. read_jsonl skips blank lines too.
        with args.file.open("rb") as handle:
            total = sum(1 for line in handle if line.strip())
    with Bar(total, "ingest", unit="record") as bar:
        report = ingest_jsonl(store, args.file, embedder, args.profile,
                              progress=bar.update if bar.active else False,
                              queue_events=wanted())
    if report.created:
        _say_created(store)
    if report.queued_events:
        deliver(store.url)
    for error in report.errors:
        print(f"{args.file}: {error}", file=sys.stderr)
    if args.json:
        _print_json(
            {"stored": report.stored, "updated": report.updated, "unchanged": report.unchanged,
             "edges": report.edges, "rejected": [str(e) for e in report.errors]}
        )
    else:
        print(
            f"stored {report.stored}, updated {report.updated}, unchanged {report.unchanged}, "
            f"edges {report.edges}, rejected {len(report.errors)}"
        )
    return EXIT_REJECTED if report.errors else EXIT_OK


def _restore(args: argparse.Namespace) -> int:
    """A backup (``reverie export``) restores its profile as it was, all or nothing."""
    from reverie.models.backup import restore_file

    store = Store()
    if store.create():  # restoring is ingesting: it may make the store
        _say_created(store)
    restored = restore_file(store.url, args.file, args.profile)
    if args.json:
        _print_json({"restored": restored.profile, "rows": restored.rows})
    else:
        counts = ", ".join(f"{n} {table}" for table, n in restored.rows.items())
        print(f"restored profile {restored.profile}: {counts}")
    return EXIT_OK


def _consolidate(args: argparse.Namespace) -> int:
    return _run_flow(args.mode, args)


def _run(args: argparse.Namespace) -> int:
    extra: dict[str, Any] = {}
    if args.task == "cold-notes":
        extra = {"scope": args.scope or ("session" if args.session else "all"),
                 "session_id": args.session, "min_age_days": args.min_age_days}
    elif args.scope or args.session or args.min_age_days is not None:
        raise ReverieError("--scope, --session and --min-age-days apply to `run cold-notes` only")
    thresholds = {"archive_threshold": args.archive_below, "delete_threshold": args.delete_below}
    if args.task in ("forget", "cold-notes"):
        from reverie.models.config import DEFAULT, with_forget_thresholds

        with_forget_thresholds(DEFAULT, args.archive_below, args.delete_below)  # one clear line
        extra.update(thresholds)
    elif any(v is not None for v in thresholds.values()):
        raise ReverieError("--archive-below and --delete-below apply to `run forget` and "
                           "`run cold-notes` only")
    days = {"migrate_after_days": args.migrate_after_days, "ttl_days": args.ttl_days}
    if args.task == "cold-tier":
        from reverie.flows.cold_tier import with_cold_tier
        from reverie.models.config import DEFAULT

        with_cold_tier(DEFAULT, args.migrate_after_days, args.ttl_days)  # one clear line
        extra.update(days)
    elif any(v is not None for v in days.values()):
        raise ReverieError("--migrate-after-days and --ttl-days apply to `run cold-tier` only")
    if args.task == "forget":
        extra["auto_approve_deletion"] = _deletion_approved(args)
    elif args.task == "cold-notes":
        # The cold sweep never pauses: unapproved, it archives only (and says so).
        extra["auto_approve_deletion"] = bool(args.approve_deletion)
    elif args.task == "cold-tier":
        # Expiry never pauses either: unapproved, it lists what it would expire.
        extra["auto_approve_expiry"] = bool(args.approve_deletion)
    elif args.approve_deletion:
        raise ReverieError("--approve-deletion applies to `run forget`, `run cold-notes` and "
                           "`run cold-tier` only")
    return _run_flow(args.task, args, **extra)


def _deletion_approved(args: argparse.Namespace) -> bool:
    """Whether `run forget` deletes without pausing for approval. A run that would delete
    with no Prefect API configured is refused before it starts: it would pause on a
    temporary server no one can answer, and hang until its approval times out."""
    from reverie.models.config import preset, with_forget_thresholds
    from reverie.models.settings import get_settings
    from reverie.runner.event_delivery import api_configured

    if args.approve_deletion or args.dry_run:
        return bool(args.approve_deletion)
    base = preset(args.preset) if args.preset else get_settings().consolidation_config()
    delete = with_forget_thresholds(
        base, args.archive_below, args.delete_below).forget.delete_threshold
    if delete == 0.0:
        return False
    if not api_configured():
        raise ReverieError(
            f"forget would delete memories below relevance {delete:g}, which "
            "needs approval, and no Prefect API is configured to ask it through: add "
            "--approve-deletion, or set PREFECT_API_URL to pause the run for approval")
    print(f"forget: deleting below {delete:g} waits for approval: the run "
          "pauses and logs its id; answer in the Prefect UI (Resume) or with "
          "`reverie approve <run id>` (--reject deletes none)", file=sys.stderr)
    return False


def _run_flow(name: str, args: argparse.Namespace, **extra: Any) -> int:
    from reverie.models.config import preset

    config: ConsolidationConfig | None = preset(args.preset) if args.preset else None
    as_of = args.as_of
    selected = _selected(args)
    # An unknown profile is the user's error: say so before a flow run starts.
    _store().resolve_profiles(selected)
    if args.not_done:
        if as_of is None:
            raise ReverieError("--not-done needs --as-of: the run whose profiles to finish")
        selected = _not_done(name, selected, as_of)
        if not selected:
            print(f"every selected profile has finished {name} as of {args.as_of}")
            return EXIT_OK
    report = run_flow(name, selected, as_of, args.dry_run, config, **extra)
    if args.json:
        _print_json(asdict(report))
        return EXIT_OK
    for step in report.steps:
        print(
            f"{step.profile:<20} {step.step:<17} examined {step.examined:>6}  "
            f"changed {step.changed:>5}  {step.seconds:.3f}s"
        )
        for note in step.notes:
            print(f"{'':<20} note: {note}")
    verb = "would change" if report.dry_run else "changed"
    print(f"{report.flow} as of {report.as_of}: {verb} {report.changed()} things"
          + (" (dry run: nothing written)" if report.dry_run else ""))
    return EXIT_OK


def _not_done(name: str, selected: str | list[str] | None, as_of: datetime) -> list[str]:
    """The selected profiles with no finished run of flow ``name`` at ``as_of`` (a run
    records a profile only when all its steps succeeded)."""
    from reverie.flows.catalog import FLOWS
    from reverie.models.repositories.runs import run_history
    from reverie.models.timestamps import to_utc_naive

    store = _store()
    with store.reading_all() as s:
        done = {r.profile_id for r in run_history(
            s, flow=FLOWS[name].name, as_of=to_utc_naive(as_of), limit=None)}
    return [p for p in store.resolve_profiles(selected) if p not in done]


def run_flow(
    name: str,
    profile: str | list[str] | None,
    as_of: datetime | None,
    dry_run: bool,
    config: ConsolidationConfig | None,
    **extra: Any,
) -> RunReport:
    """Run a flow by its short name in this process (against PREFECT_API_URL if set)."""
    from reverie.deployments.local_server import local_api
    from reverie.flows.catalog import FLOWS
    from reverie.runner.runtime import wait_for_run_history

    with local_api():
        report = FLOWS[name](
            profile=profile, as_of=as_of, dry_run=dry_run, config=config, **extra
        )
    wait_for_run_history(report.run_id)
    return report


def _server(args: argparse.Namespace) -> int:
    from reverie.deployments.local_server import prefect_home, running, stop

    home = prefect_home()
    if args.action == "stop":
        stopped = stop(home)
        print(f"stopped the local Prefect server at {stopped.url}" if stopped
              else "no local Prefect server runs")
        return EXIT_OK
    server = running(home)
    if server is None:
        print(f"no local Prefect server runs (PREFECT_HOME {home}); the next local "
              "command starts one")
    else:
        print(f"local Prefect server at {server.url} (pid {server.pid}, database in "
              f"{home}); stops after {server.idle_seconds:g} s unused")
    return EXIT_OK


def _approve(args: argparse.Namespace) -> int:
    from uuid import UUID

    from prefect.exceptions import FlowPauseTimeout, NotPausedError, ObjectNotFound
    from prefect.flow_runs import resume_flow_run

    from reverie.runner.event_delivery import api_configured

    if not api_configured():
        raise ReverieError("no Prefect API is configured: set PREFECT_API_URL to the server "
                           "the run is paused on")
    try:
        run_id = UUID(args.run_id)
    except ValueError:
        raise ReverieError(f"not a flow run id: {args.run_id!r}") from None
    try:
        resume_flow_run(run_id, run_input={"approve": not args.reject, "reason": args.reason})
    except ObjectNotFound:
        raise ReverieError(f"no flow run {run_id}") from None
    except NotPausedError:
        raise ReverieError(f"flow run {run_id} is not paused") from None
    except FlowPauseTimeout:
        raise ReverieError(f"flow run {run_id} waited too long and can no longer resume") \
            from None
    except RuntimeError as exc:  # Prefect refused the answer (e.g. it fits no form)
        raise ReverieError(f"flow run {run_id}: {exc}") from None
    print(f"{run_id}: deletion {'rejected' if args.reject else 'approved'}")
    return EXIT_OK


def _backfill(args: argparse.Namespace) -> int:
    from reverie.deployments.backfill import backfill, parse_every

    report = backfill(
        args.flow, args.start, args.end,
        parse_every(args.every), _selected(args),
    )
    if args.json:
        ended = _ended(args, report)
        _print_json({**asdict(report), "ended": ended})
        return EXIT_REJECTED if set((ended or {}).values()) - {"COMPLETED"} else EXIT_OK
    if report.where == "local":
        print(
            f"backfill of {report.flow} via {report.where}: {len(report.created)} run(s) made, "
            f"{len(report.skipped)} date(s) already done"
        )
        from reverie.runner.progress import on_terminal

        if not (sys.stdout.isatty() and on_terminal()):  # else each was shown as it ran
            for when in report.created:
                print(f"  ran {when}")
        return EXIT_OK
    print(
        f"backfill of {report.flow} via {report.where}: {len(report.created)} date(s) to "
        f"replay in {len(report.runs)} run(s), one per profile; "
        f"{len(report.skipped)} date(s) already done"
    )
    for profile in report.running:
        print(f"  {profile}: its replay of {report.flow} is still queued or running")
    return _wait_for_backfill(args, report)


def _ended(args: argparse.Namespace, report: Any) -> dict[str, str] | None:
    """``--wait`` through Prefect: each replay run the backfill depends on, once all have
    ended, with its final state; None without ``--wait`` or when it ran here."""
    from reverie.deployments.backfill import replays_to_wait_for, wait_for_replays

    if not args.wait or report.where == "local":
        return None
    return wait_for_replays(replays_to_wait_for(report, _store()))


def _wait_for_backfill(args: argparse.Namespace, report: Any) -> int:
    ended = _ended(args, report)
    if ended is None:
        return EXIT_OK
    failed = {run: state for run, state in ended.items() if state != "COMPLETED"}
    print(f"backfill of {report.flow}: {len(ended) - len(failed)} replay run(s) completed, "
          f"{len(failed)} did not")
    for run, state in sorted(failed.items()):
        print(f"  replay run {run}: {state}")
    return EXIT_REJECTED if failed else EXIT_OK


def _status(args: argparse.Namespace) -> int:
    from reverie.deployments.status import as_json, collect, render
    from reverie.models.settings import display_url

    store = _store()
    status = collect(store, args.profile, args.limit)
    if args.json:
        _print_json(as_json(status))
    else:
        print(f"store: {display_url(store.url)}")
        print(render(status))
    return EXIT_OK


def _session_end(args: argparse.Namespace) -> int:
    from reverie.models.repositories.runs import end_session
    from reverie.models.timestamps import utcnow
    from reverie.runner.event_delivery import api_configured, deliver, wanted

    store = _store()
    store.resolve_profiles(args.profile)
    queue_events = wanted()
    with store.writing(args.profile) as tx:
        count = end_session(tx, args.session, utcnow(), store.settings.session_trigger_every,
                            queue_events)
    if queue_events:
        deliver(store.url)
    print(f"{args.profile}: session {count} ended")
    if not api_configured():
        # The consolidation that follows a session end is a Prefect trigger's.
        print(f"no Prefect API is configured (PREFECT_API_URL): no run follows; "
              f"`reverie consolidate full --profile {args.profile}` consolidates now",
              file=sys.stderr)
    return EXIT_OK


def _alerts(args: argparse.Namespace) -> int:
    from reverie.deployments.alerts import ensure_failure_alerts
    from reverie.runner.event_delivery import api_configured

    if not api_configured():
        raise ReverieError("alerts live in a Prefect server: set PREFECT_API_URL")
    state = ensure_failure_alerts("" if args.off else args.block)
    if state.enabled:
        print(f"failed and crashed Reverie runs are announced through {state.block}")
    else:
        print("alerts are off" + (" (automation paused)" if state.automation_id else "")
              + "; --block TYPE/NAME or REVERIE_ALERT_BLOCK turns them on")
    return 0


def _events(args: argparse.Namespace) -> int:
    from reverie.models.outbox import waiting

    pending = waiting(_store().url)
    if args.json:
        _print_json([asdict(p) for p in pending])
    elif not pending:
        print("no events waiting")
    else:
        for p in pending:
            print(f"{p.profile}: {p.events} event(s) waiting, "
                  f"the oldest from {p.oldest:%Y-%m-%d %H:%M:%S} UTC")
    return EXIT_OK


def _events_flush(args: argparse.Namespace) -> int:
    import time

    from reverie.models.errors import TransientError
    from reverie.models.transient import retrying
    from reverie.runner.event_delivery import FlushResult, Outcome, flush

    url = _store().url
    give_up = time.monotonic() + args.timeout
    results: list[FlushResult] = []

    class NotYet(TransientError):
        """Events are left and --timeout lasts: flush again after ``retry_after``."""
    # Another process is sending (it takes everything before it stops): look again
    # soon. The API did not answer in time (a server starting or restarting): look
    # again less often each time. Either while --timeout lasts, no wait beyond it.
    pauses = iter(min(0.5 * 2**n, 5.0) for n in range(64))
    pause = 0.5

    def attempt() -> FlushResult:
        nonlocal pause
        result = flush(url, budget=max(0.0, give_up - time.monotonic()))
        results.append(result)
        if result.outcome is Outcome.UNREACHABLE:
            pause = next(pauses, 5.0)
        if result.outcome in (Outcome.BUSY, Outcome.UNREACHABLE):
            left = give_up - time.monotonic()
            if left > 0:
                not_yet = NotYet(result.outcome.value)
                not_yet.retry_after = min(pause, left)
                raise not_yet
        return result

    try:
        # No bound on attempts: --timeout is the bound (a store lock waited on counts).
        retrying(attempt, attempts=None, first=0.5, cap=5.0, timeout=max(args.timeout, 0.01))
    except NotYet:
        pass  # --timeout ran out: the last result says what is left
    result = results[-1]
    sent = sum(r.sent for r in results)
    if args.json:
        _print_json({"outcome": result.outcome.value, "sent": sent,
                     "pending": result.pending, "error": result.error})
    else:
        print(f"sent {sent}, waiting {result.pending}")
    if result.pending == 0:
        return EXIT_OK
    reasons = {
        Outcome.UNREACHABLE: f"the Prefect API did not take them ({result.error}) in "
                             f"{args.timeout:g} s; they stay in the store: flush again "
                             "once it answers",
        Outcome.NO_API: "no Prefect API is configured: set PREFECT_API_URL",
        Outcome.BUSY: "another process is still sending them",
        Outcome.INCOMPLETE: "time ran out: flush again to send the rest",
    }
    print(f"reverie: {result.pending} event(s) not sent: {reasons.get(result.outcome, '')}",
          file=sys.stderr)
    return EXIT_ERROR


def _undo(args: argparse.Namespace) -> int:
    from reverie.models.repositories.summaries import undo
    from reverie.models.timestamps import utcnow

    with _store().writing(args.profile) as tx:
        result = undo(tx, args.id, utcnow())
    if args.json:
        _print_json(asdict(result))
    elif result.already_undone:
        print(f"{result.consolidation_id} was already undone; nothing changed")
    else:
        print(
            f"undid {result.operation} {result.consolidation_id} in {result.profile}: "
            f"{len(result.restored)} memories restored"
            + (f", summary {result.summary_id} removed" if result.summary_id else "")
        )
    return EXIT_OK


def _consolidations(args: argparse.Namespace) -> int:
    store = _store()
    store.resolve_profiles(args.profile)
    from reverie.models.repositories.audit import (
        consolidation_count,
        consolidations,
        summary_texts,
    )

    limit = None if args.all else args.limit or CONSOLIDATIONS_SHOWN
    with store.reading(args.profile) as tx:
        rows = consolidations(tx, limit)
        total = len(rows) if limit is None or len(rows) < limit else consolidation_count(tx)
        texts = summary_texts(tx, rows)
    if args.json:
        _print_json({
            "profile": args.profile, "total": total, "shown": len(rows),
            "consolidations": [
                {**r.model_dump(mode="json"), "summary_text": texts.get(r.id)} for r in rows
            ],
        })
        return EXIT_OK
    if not rows:
        print(f"no consolidation decisions yet for {args.profile}")
        return EXIT_OK
    width = shutil.get_terminal_size((120, 24)).columns
    print(f"{'id':<18}  {'created':<10}  {'operation':<9}  {'summary':<18}  "
          f"{'members':>7}  summary text")
    for r in rows:
        state = f"[undone {r.undone_at:%Y-%m-%d %H:%M}] " if r.undone_at else ""
        head = (f"{r.id:<18}  {r.created_at:%Y-%m-%d}  {r.operation:<9}  "
                f"{r.summary_id or '-':<18}  {len(r.member_ids):>7}  ")
        text = " ".join(texts.get(r.id, "-").split())  # one line per decision
        print(head + _clipped(state + text, max(40, width - len(head))))
        if args.why:
            for line in _why(r.parameters or {}):
                print(f"    {line}")
    if len(rows) < total:
        print(f"showing {len(rows)} of {total}, newest first; --limit N or --all for more")
    else:
        print(f"{total} decision{'s' if total != 1 else ''}, newest first")
    return EXIT_OK


def _clipped(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# Audit parameters that say how to undo a decision or what it absorbed, not why.
_NOT_WHY = frozenset({"prior", "absorbed", "undone_summary", "rule", "similarities", "heats",
                      "conflicts"})


def _why(parameters: dict[str, Any]) -> list[str]:
    """A decision's audit, in lines: its rule, its knobs, each member's similarity to
    the group (or heat, for cold notes) and, for a supersession, what each disagrees on."""
    lines = [f"rule: {parameters['rule']}"] if parameters.get("rule") else []
    knobs = [f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}"
             for k, v in parameters.items() if k not in _NOT_WHY]
    if knobs:
        lines.append("knobs: " + ", ".join(knobs))
    for key, label in (("similarities", "similarity"), ("heats", "heat")):
        values = parameters.get(key) or {}
        if values:
            lines.append(f"{label}: " + ", ".join(
                f"{mid} {value:.3f}" for mid, value in values.items()))
    conflicts = parameters.get("conflicts") or {}
    if conflicts:
        lines.append("conflicts: " + ", ".join(f"{mid} {kind}" for mid, kind in conflicts.items()))
    if parameters.get("absorbed"):
        lines.append("absorbed: " + ", ".join(parameters["absorbed"]))
    return lines


def _blocks(args: argparse.Namespace) -> int:
    store = _store()
    store.resolve_profiles(args.profile)
    from reverie.models.repositories.blocks import blocks as blocks_of

    with store.reading(args.profile) as tx:
        blocks = blocks_of(tx)
    if args.json:
        _print_json([b.model_dump() for b in blocks])
        return EXIT_OK
    from reverie.models.settings import get_settings
    from reverie.tasks.blocks import block_rules

    rules = block_rules(get_settings().consolidation_config().blocks)
    if not blocks:
        print(f"no blocks yet for {args.profile}: run `reverie consolidate` first")
    for b in blocks:
        print(f"## {b.block_type}  (v{b.version}, {len(b.content)} chars, {b.mode})")
        print(f"rule: {rules.get(b.block_type, '-')}")
        print(b.content or "(empty: no memory meets the rule yet)")
        print()
    return EXIT_OK


def _recall(args: argparse.Namespace) -> int:
    from reverie.recall.search import recall

    hits = recall(_store(), args.profile, args.query, args.k, args.deep, args.track)
    if args.json:
        _print_json([
            {"score": h.score, **_memory_json(h.memory), "text": h.text,
             "matched": [_memory_json(o) for o in h.members] if h.excerpted else []}
            for h in hits
        ])
        return EXIT_OK
    for h in hits:
        m = h.memory
        tag = f"[{m.tier}]" + (f" superseded by {m.superseded_by}" if m.superseded_by else "")
        ext = f" ({m.external_id})" if m.external_id else ""
        if h.excerpted:
            # A summary shows the members that matched; the whole is one `get` away.
            tag += (f" {m.origin}: {len(h.members)} member(s) that matched "
                    f"(reverie get {m.id}: the whole summary)")
        body = h.text.replace("\n", "\n       ")
        print(f"{h.score:.3f}  {m.id}{ext} {m.kind} {tag}\n       {body}")
    return EXIT_OK


def _get(args: argparse.Namespace) -> int:
    from reverie.models.repositories.memories import get

    with _store().reading_all() as s:
        found = get(s, args.id, args.profile)
    data = (
        {"tombstone": True, **found.model_dump()}
        if isinstance(found, Tombstone)
        else _memory_json(found)
    )
    if args.json:
        _print_json(data)
    else:
        # What a person looks for first: which memory, and what it says.
        first = [k for k in ("tombstone", "id", "external_id", "profile_id", "content")
                 if k in data]
        for key in [*first, *(k for k in data if k not in first)]:
            print(f"{key:>18}: {data[key]}")
    return EXIT_OK


def _memory_json(m: Memory | Any) -> dict[str, Any]:
    data = m.model_dump() if isinstance(m, Memory) else asdict(m)
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in data.items()}


def _export(args: argparse.Namespace) -> int:
    from reverie.models.backup import backup_lines
    from reverie.models.export import export_jsonl

    store = _store()
    store.resolve_profiles(args.profile)
    lines: Iterable[str] = (
        [export_jsonl(store.url, args.profile, args.with_run_ids)] if args.canonical
        else backup_lines(store.url, args.profile))
    if args.output:
        with args.output.open("w", encoding="utf-8") as out:
            out.writelines(lines)
    else:
        sys.stdout.writelines(lines)
    return EXIT_OK


def _names(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"no conversation named: {text!r}")
    return names


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes must be whole numbers: {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be at least 1: {text!r}")
    return sizes


def _bench(args: argparse.Namespace) -> int:
    if args.bench == "synthetic":
        return _bench_synthetic(args)
    if args.bench == "embedding":
        return _bench_embedding(args)
    if args.bench == "updates":
        return _bench_updates(args)
    if args.bench == "api":
        return _bench_api(args)
    from reverie.benchmarks.locomo import (
        bench_locomo,
        load_locomo,
        render_locomo,
        select_conversations,
    )

    if not args.path.is_file():
        raise ReverieError(f"no such file: {args.path}")
    select_conversations(load_locomo(args.path), args.conversations)  # bad input: at once
    from reverie.models.config import preset

    base = preset(args.preset) if args.preset else ConsolidationConfig()
    config = base.model_copy(update={"summarizer": args.summarizer})
    from reverie.runner.temporary_server import keep_with_this_process

    keep_with_this_process()
    result = bench_locomo(args.path, args.as_of_offset_days, args.budget, config,
                          args.conversations)
    print(render_locomo(result))
    if args.json_out:
        args.json_out.write_text(json.dumps(result.as_json(), indent=2) + "\n", encoding="utf-8")
    return EXIT_OK


def _bench_updates(args: argparse.Namespace) -> int:
    from reverie.benchmarks.updates import bench_updates, render_updates
    from reverie.models.config import preset
    from reverie.runner.temporary_server import keep_with_this_process

    base = preset(args.preset) if args.preset else ConsolidationConfig()
    config = base.model_copy(update={"summarizer": args.summarizer})
    keep_with_this_process()
    result = bench_updates(args.profiles, args.as_of_offset_days, config)
    print(render_updates(result))
    if args.json_out:
        args.json_out.write_text(json.dumps(result.as_json(), indent=2) + "\n", encoding="utf-8")
    return EXIT_OK


def _bench_api(args: argparse.Namespace) -> int:
    from reverie.benchmarks.api import bench_api, render_api

    if args.profiles < 1 or args.requests < 1 or args.store_requests < 1 or args.store_batch < 1:
        raise ReverieError("--profiles, --requests, --store-requests and --store-batch "
                           "must be at least 1")
    command = (f"reverie bench api --sizes {','.join(map(str, args.sizes))} "
               f"--clients {','.join(map(str, args.clients))} --profiles {args.profiles} "
               f"--requests {args.requests} --store-requests {args.store_requests} "
               f"--store-batch {args.store_batch} --ingest-sentences {args.ingest_sentences}")

    def progress(row: Any) -> None:
        print(f"{row.operation:<7} n={row.memories_per_profile:<7,} clients={row.clients:<3} "
              f"p50 {row.p50_ms:8.1f} ms  p95 {row.p95_ms:8.1f} ms  "
              f"{row.calls_per_second:7.1f} calls/s  errors {row.errors}", flush=True)

    result = bench_api(args.sizes, args.clients, args.profiles, args.requests,
                       args.store_requests, args.store_batch, args.ingest_sentences,
                       command, progress)
    text = render_api(result)
    print(text)
    if args.json_out:
        args.json_out.write_text(json.dumps(result.as_json(), indent=2) + "\n", encoding="utf-8")
    if args.markdown:
        args.markdown.write_text(text + "\n", encoding="utf-8")
    return EXIT_OK


def _bench_embedding(args: argparse.Namespace) -> int:
    from reverie.benchmarks.embedding import bench_embedding, render_embedding

    if args.locomo is not None and not args.locomo.is_file():
        raise ReverieError(f"no such file: {args.locomo}")
    if args.sentences < 16:
        raise ReverieError(f"--sentences must be at least 16, got {args.sentences}")
    rows = bench_embedding(args.locomo, args.sentences)
    print(render_embedding(rows))
    if args.json_out:
        args.json_out.write_text(json.dumps([r.as_json() for r in rows], indent=2) + "\n",
                                 encoding="utf-8")
    return EXIT_OK


def _bench_synthetic(args: argparse.Namespace) -> int:
    import os

    # Prefect reads these when it is first imported: keep its console to warnings.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from reverie.benchmarks.speed import (
        FLOW_ORDER,
        as_json,
        backend,
        bench_synthetic,
        render_markdown,
    )
    from reverie.deployments.serve import loopback_server
    from reverie.runner.temporary_server import keep_with_this_process

    unknown = sorted(set(args.flow_list or ()) - set(FLOW_ORDER))
    if unknown:
        raise ReverieError(f"--flow-list: unknown flow(s) {', '.join(unknown)}; "
                           f"choose from {', '.join(FLOW_ORDER)}")
    if args.database_url and not args.database_url.startswith("postgresql"):
        raise ReverieError("--database-url: a PostgreSQL server URL, e.g. "
                           "postgresql+psycopg2://user:password@host:5432/postgres")
    store_backend = backend(args.database_url)
    if args.flows and not args.server:
        keep_with_this_process()

    command = (
        f"reverie bench synthetic --sizes {','.join(map(str, args.sizes))} "
        f"--profiles {args.profiles} --duplicate-share {args.duplicate_share:g} "
        f"--embeddings {args.embeddings} --ingest-sentences {args.ingest_sentences}"
        + ("" if args.flows else " --no-flows") + ("" if args.checks else " --no-baseline")
        + ("" if args.step_rows else " --no-steps") + (" --server" if args.server else "")
        + (f" --flow-list {','.join(args.flow_list)}" if args.flow_list else "")
        + (f" --database-url {store_backend['database_server']}" if args.database_url else "")
    )
    done: list[Any] = []

    def progress(row: Any) -> None:
        verdict = f"  [{row.verdict}]" if row.verdict else ""
        print(f"{row.task:<34} n={row.n:<9,} {row.seconds:9.3f} s  "
              f"peak {row.peak_rss_mb or 0:7.0f} MB{verdict}", flush=True)
        # Rewritten after every row: a long run interrupted keeps the rows it measured.
        done.append(row)
        if args.json_out:
            args.json_out.write_text(
                json.dumps(as_json(done, command, store_backend), indent=2) + "\n", encoding="utf-8"
            )
        if args.markdown:
            args.markdown.write_text(render_markdown(done) + "\n", encoding="utf-8")

    results = bench_synthetic(
        args.sizes, args.profiles, args.duplicate_share, args.embeddings, args.flows,
        args.checks, args.ingest_sentences, progress,
        server=loopback_server if args.server else None,
        step_rows=args.step_rows, flow_names=args.flow_list or FLOW_ORDER,
        database_url=args.database_url,
    )
    print(render_markdown(results))  # the files already hold every row
    return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    from reverie.deployments.serve import serve

    return serve(args.port, args.home)


def _api(args: argparse.Namespace) -> int:
    from reverie.deployments.auth import load_tokens
    from reverie.deployments.http_api import serve
    from reverie.models.settings import get_settings

    _store()  # a store that is not there: said now, not on each agent's call
    tokens = load_tokens(get_settings())
    print(f"reverie api on http://{args.host}:{args.port} (OpenAPI: /docs, MCP: /mcp)",
          file=sys.stderr, flush=True)
    serve(tokens, args.host, args.port)
    return EXIT_OK


def _mcp(args: argparse.Namespace) -> int:
    from reverie.deployments.auth import load_tokens
    from reverie.models.settings import get_settings

    _store()  # a store that is not there: said now, not on each agent's call
    tokens = load_tokens(get_settings())
    if args.transport == "http":
        from reverie.deployments.http_api import serve

        serve(tokens, args.host, args.port)
        return EXIT_OK
    from reverie.deployments.mcp_server import run_stdio

    run_stdio(tokens)
    return EXIT_OK


def _init(args: argparse.Namespace) -> int:
    """Create the configured store (nothing else does but ingest and demo); say where,
    and its id (what its events and automations name)."""
    from reverie.models.settings import display_url

    store = Store()
    created = store.create()
    if args.json:
        _print_json({"store": display_url(store.url), "id": store.id, "created": created})
    elif created:
        _say_created(store)
    else:
        print(f"a store is already at {display_url(store.url)} (id {store.id}); "
              "left as it is", file=sys.stderr)
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    from reverie.demo.run import run_demo
    from reverie.deployments.local_server import local_api

    return run_demo(args.database, local_api)


def console() -> NoReturn:
    """The ``reverie`` executable: ``main``, then exit without the interpreter's last
    garbage collection over Prefect's ~200,000 objects (half a second of a local
    command). ``gc.freeze`` moves them out of the collector's reach; everything else at
    exit (flushing Prefect's logs and events, closing files) happens as before."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`reverie consolidations | head`): stop quietly, and keep
        # the interpreter from failing again as it flushes stdout on the way out.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_REJECTED
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    console()
