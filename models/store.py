"""The memory store: where it is, and the transactions every query and write runs in.

The queries and writes themselves live in ``models.repositories``, one module per
aggregate, as functions taking the transaction. A profile's work goes through
``reading(profile)`` / ``writing(profile)``, whose ``ProfileTx`` names the one profile
the block may touch; cross-profile work (run history, leases, the profile list) goes
through ``reading_all()`` / ``writing_all()`` and gets a plain session.

The database's own failures leave these blocks as the errors of ``models.errors``,
grouped by what the caller can do: retry (``StoreRetryableError``) or report
(``StorePermanentError``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import exc as db
from sqlalchemy import select
from sqlmodel import Session

from reverie.models import db as engines
from reverie.models.errors import (
    IntegrityViolationError,
    InvalidValueError,
    NotFoundError,
    StoreError,
    StoreUnavailableError,
)
from reverie.models.settings import Settings, get_settings, resolve_database_url
from reverie.models.tables import Profile


@dataclass(frozen=True, slots=True)
class ProfileTx:
    """One transaction on one profile: repository functions read and write ``profile``
    only, so one call cannot mix two profiles' rows."""

    session: Session
    profile: str


class Store:
    """One memory store, addressed by its database URL."""

    def __init__(self, url: str | None = None, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.url = resolve_database_url(url or self.settings.database_url)

    # --- transactions -----------------------------------------------------------------

    @contextmanager
    def reading_all(self) -> Iterator[Session]:
        """A session for reads across profiles, never committed. One block is one
        snapshot: REPEATABLE READ on PostgreSQL (its default would let each statement
        see a newer state), as a SQLite read transaction is already."""
        with _translated():
            engine = engines.engine_for(self.url)
            if engine.dialect.name == "postgresql":
                engine = engine.execution_options(isolation_level="REPEATABLE READ")  # type: ignore[assignment]
            with Session(engine, expire_on_commit=False) as session:
                yield session

    @contextmanager
    def writing_all(self) -> Iterator[Session]:
        """One atomic transaction across profiles: committed on success, rolled back on
        any error."""
        with _translated(), engines.writing(self.url) as session:
            yield session

    @contextmanager
    def reading(self, profile: str) -> Iterator[ProfileTx]:
        with self.reading_all() as session:
            yield ProfileTx(session, profile)

    @contextmanager
    def writing(self, profile: str) -> Iterator[ProfileTx]:
        with self.writing_all() as session:
            yield ProfileTx(session, profile)

    # --- profiles ---------------------------------------------------------------------

    def profiles(self) -> list[str]:
        with self.reading_all() as s:
            return list(s.execute(select(Profile.id).order_by(Profile.id)).scalars())

    def resolve_profiles(self, selector: str | Sequence[str] | None) -> list[str]:
        """``None`` means every profile; a name or a list must all exist."""
        known = self.profiles()
        if selector is None:
            return known
        wanted = [selector] if isinstance(selector, str) else list(selector)
        missing = sorted(set(wanted) - set(known))
        if missing:
            raise NotFoundError(f"no profile named {', '.join(map(repr, missing))}")
        return sorted(set(wanted))


@contextmanager
def _translated() -> Iterator[None]:
    """The driver's failures as the store's errors, the original kept as the cause."""
    try:
        yield
    except StoreError:
        raise
    except db.IntegrityError as exc:
        raise IntegrityViolationError(_reason(exc)) from exc
    except db.DataError as exc:
        raise InvalidValueError(_reason(exc)) from exc
    except (db.OperationalError, db.InterfaceError, db.DisconnectionError, db.TimeoutError) as exc:
        # Lost connections, lock waits ("database is locked"), serialization failures and
        # deadlocks (PostgreSQL's TransactionRollbackError is an OperationalError).
        raise StoreUnavailableError(_reason(exc)) from exc
    except db.DBAPIError as exc:
        if exc.connection_invalidated:
            raise StoreUnavailableError(_reason(exc)) from exc
        raise
    except db.StatementError as exc:
        # Not sent: a value a column type or the driver could not convert.
        raise InvalidValueError(_reason(exc)) from exc
    except OverflowError as exc:  # sqlite3 raises it itself for an integer beyond 64 bits
        raise InvalidValueError("a number is too large") from exc


def _reason(exc: db.StatementError) -> str:
    """The driver's first line, without the statement (parameters are hidden already)."""
    said = str(exc.orig).strip() if exc.orig is not None else ""
    return said.splitlines()[0] if said else type(exc).__name__
