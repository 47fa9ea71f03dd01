"""The memory store: where it is, and the transactions every query and write runs in.

The queries and writes themselves live in ``models.repositories``, one module per
aggregate, as functions taking the transaction. A profile's work goes through
``reading(profile)`` / ``writing(profile)``, whose ``ProfileTx`` names the one profile
the block may touch (in the form the store keeps names in, ``ids.given_id``);
cross-profile work (run history, leases, the profile list) goes through
``reading_all()`` / ``writing_all()`` and gets a plain session.

The database's own failures leave these blocks as the errors of ``models.errors``,
grouped by what the caller can do: retry (``StoreRetryableError``) or report
(``StorePermanentError``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlmodel import Session, col

from reverie.models import db as engines
from reverie.models.errors import NotFoundError
from reverie.models.ids import sought_id
from reverie.models.repositories.profiles import bump_write_seqs
from reverie.models.settings import Settings, get_settings, resolve_database_url
from reverie.models.tables import Profile
from reverie.models.timestamps import to_utc_naive


@dataclass(frozen=True, slots=True)
class ProfileTx:
    """One transaction on one profile: repository functions read and write ``profile``
    only, so one call cannot mix two profiles' rows.

    ``horizon``: the profile's ``ingest_seq`` when a run took it. Memories an ingest
    wrote after that (a new memory, or new content for one) are beyond it: the
    repositories' reads of a profile's memories leave them out and their writes leave
    them alone, so a run never acts on what it did not see, and they wait for the next
    run (the store ends as if the ingest had come after the run). ``None``: the profile
    as it is.

    ``as_of``: the run's 'now' (naive UTC). A memory created after it does not exist
    yet for the run: the same reads leave it out and the same writes leave it alone,
    so a run dated in the past (a backfill) acts on the store as it was then, and the
    memory waits for a run dated at or after its ``created_at``. ``None``: no bound
    (recall, ingest, export, undo)."""

    session: Session
    profile: str
    horizon: int | None = None
    as_of: datetime | None = None


def _naive(as_of: datetime | None) -> datetime | None:
    """A run's 'now' as the store keeps times (naive UTC, a plain datetime)."""
    return None if as_of is None else to_utc_naive(as_of)


class Store:
    """One memory store, addressed by its database URL."""

    def __init__(self, url: str | None = None, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.url = resolve_database_url(url or self.settings.database_url)

    # --- the store itself ---------------------------------------------------------------

    def exists(self) -> bool:
        """Whether there is a store at the URL (only a SQLite file can be missing)."""
        return engines.store_exists(self.url)

    def create(self) -> bool:
        """Create the store if it is not there (file, folder, schema, its id); True when
        it was created. Only ``reverie init``, ``reverie ingest`` and ``reverie demo``
        (and tests) create stores: everything else fails on a missing one, naming it."""
        return engines.create_store(self.url)

    @property
    def id(self) -> str:
        """The store's own id, made when it was created: its events name it."""
        return engines.store_id(self.url)

    # --- transactions -----------------------------------------------------------------

    @contextmanager
    def reading_all(self) -> Iterator[Session]:
        """A session for reads across profiles, never committed; one block is one
        snapshot (``models.db.reading``)."""
        with engines.reading(self.url) as session:
            yield session

    @contextmanager
    def writing_all(self) -> Iterator[Session]:
        """One atomic transaction across profiles: committed on success, rolled back on
        any error."""
        with engines.writing(self.url) as session:
            yield session

    @contextmanager
    def reading(self, profile: str, horizon: int | None = None,
                as_of: datetime | None = None) -> Iterator[ProfileTx]:
        name = sought_id(profile, "profile named")
        with self.reading_all() as session:
            yield ProfileTx(session, name, horizon, _naive(as_of))

    @contextmanager
    def writing(self, profile: str, horizon: int | None = None,
                as_of: datetime | None = None) -> Iterator[ProfileTx]:
        """One atomic transaction on one profile. It counts as a write of the profile
        (``Profile.write_seq``) whatever it writes: every step, undo, forget and decay
        writes here, and a recall cache is only as safe as the count is complete."""
        name = sought_id(profile, "profile named")
        with self.writing_all() as session:
            bump_write_seqs(session, [name])
            yield ProfileTx(session, name, horizon, _naive(as_of))

    # --- profiles ---------------------------------------------------------------------

    def profiles(self) -> list[str]:
        with self.reading_all() as s:
            return list(s.execute(select(col(Profile.id)).order_by(col(Profile.id))).scalars())

    def has_profile(self, name: str) -> bool:
        """Whether the store holds ``name`` (one row read, not the list of profiles)."""
        wanted = sought_id(name, "profile named")
        with self.reading_all() as s:
            return s.execute(select(col(Profile.id)).where(
                col(Profile.id) == wanted)).first() is not None

    def resolve_profiles(self, selector: str | Sequence[str] | None) -> list[str]:
        """``None`` means every profile; a name or a list must all exist."""
        known = self.profiles()
        if selector is None:
            return known
        wanted = [sought_id(name, "profile named")
                  for name in ([selector] if isinstance(selector, str) else selector)]
        missing = sorted(set(wanted) - set(known))
        if missing:
            raise NotFoundError(f"no profile named {', '.join(map(repr, missing))}")
        return sorted(set(wanted))
