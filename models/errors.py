"""Every error Reverie raises on purpose.

Hierarchy::

    ReverieError
    ├── ConfigError            a setting or flow parameter is out of bounds
    ├── InputError             a record offered to the store is invalid
    │   └── RecordError        ... names the record (line or id) and the field
    ├── NotFoundError          no memory, profile or tombstone has that id
    │   └── AmbiguousIdError   an external id exists in several profiles
    ├── StoreError             the store cannot do what was asked
    │   ├── StoreRetryableError        the same call may succeed later (also Transient)
    │   │   ├── StoreUnavailableError  connection lost, database locked, serialization
    │   │   └── ConflictError          what was read changed before the write
    │   └── StorePermanentError        the same call fails the same way every time
    │       ├── IntegrityViolationError  a constraint refused the write
    │       ├── InvalidValueError        the database refused a value
    │       ├── RefusedError             the request is not allowed (e.g. undo a forget)
    │       └── EmbeddingError           the embedding model is missing or gave a bad vector
    ├── TransientError         a fault that may pass by itself: try again later
    └── StepFailedError        a run's steps failed for some profiles; the rest finished

Store errors are grouped by what the caller can do about them: retry
(``StoreRetryableError``) or give up and report (``StorePermanentError``); retries key
on the class, never on the message.

Callers that only want "did Reverie refuse this?" catch ``ReverieError``; the CLI
turns it into a one-line message and a non-zero exit code.
"""

from __future__ import annotations


class ReverieError(Exception):
    """Base class for every error Reverie raises on purpose."""


class ConfigError(ReverieError):
    """A setting or a flow parameter is invalid."""


class InputError(ReverieError):
    """A record offered to the store is invalid."""


class RecordError(InputError):
    """One record is invalid; names where it came from and which field is wrong."""

    def __init__(self, where: str, field: str | None, message: str) -> None:
        self.where = where
        self.field = field
        self.message = message
        location = f"{where}, field '{field}'" if field else where
        super().__init__(f"{location}: {message}")


class NotFoundError(ReverieError):
    """No memory, profile or tombstone has the given id."""


class AmbiguousIdError(NotFoundError):
    """An external id is used in more than one profile; a profile must be named."""


class StoreError(ReverieError):
    """The store cannot carry out the request."""


class TransientError(ReverieError):
    """A fault that may pass without anyone changing anything (a lost connection, a
    server restarting): what retries are for. See ``models.transient.is_transient`` for
    the library errors treated the same way."""

    # Seconds the fault itself asks to wait before the next try (a server's
    # Retry-After); None: the retry's own back-off.
    retry_after: float | None = None


class StoreRetryableError(StoreError, TransientError):
    """Trying the same call again may succeed: nothing about the request is wrong."""


class StoreUnavailableError(StoreRetryableError):
    """The database could not be reached or answered "not now": a lost connection, a
    lock held too long (SQLite's "database is locked"), a serialization failure."""


class ConflictError(StoreRetryableError):
    """Rows a write depends on changed since they were read; a fresh read and plan
    will see the new state."""


class StorePermanentError(StoreError):
    """The request itself is at fault: the same call fails the same way every time."""


class StoreMissingError(StorePermanentError):
    """There is no store at the configured URL (a SQLite file or folder that does not
    exist): nothing is created, since the likeliest cause is a typo."""


class IntegrityViolationError(StorePermanentError):
    """A uniqueness or other constraint refused the write."""


class InvalidValueError(StorePermanentError):
    """The database (or its driver) refused a value: out of range, not convertible."""


class RefusedError(StorePermanentError):
    """The store will not do this (undo a deletion, undo a summary absorbed since)."""


class EmbeddingError(StorePermanentError):
    """The embedding model is unavailable or returned an unusable vector."""


class HoldUnavailableError(TransientError):
    """Prefect could not give a run its hold on some profiles: their concurrency limits
    were gone again right after being made (an operator or another run deleting them).
    A later attempt may find them."""


class ServerStartError(TransientError):
    """The temporary orchestration server a command starts for itself did not answer
    in time (a loaded machine): nothing was run. The same command again may find the
    machine quieter; a longer start-up allowance or a running server avoids it."""


class WrongStoreError(ReverieError):
    """A run started by one store's event would work on another store: refused."""


class EmptyStoreError(ReverieError):
    """A run over every profile of a store that has none: a store just created, or a
    mistyped URL. It fails, so that the platform's failure alert says so."""


class StepFailedError(ReverieError):
    """Steps failed for some profiles after their retries; every other profile finished
    and is recorded. Re-run the flow for the profiles named."""

    def __init__(self, failed: dict[str, list[str]], as_of: str) -> None:
        self.failed = failed
        self.as_of = as_of
        names = sorted(failed)
        shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
        first = failed[names[0]][0]
        # The run's own as_of is spelled out: a scheduled or triggered run had none
        # given, and the advice must work as printed.
        super().__init__(
            f"{len(names)} profile(s) failed ({shown}); the others finished. "
            f"First failure, {names[0]}: {first}. Re-run the flow for these alone "
            f"(CLI: --not-done --as-of {as_of})"
        )

    def __reduce__(self) -> tuple[type, tuple[dict[str, list[str]], str]]:
        # Prefect pickles a failed run's exception; the default would rebuild it from
        # the message alone.
        return type(self), (self.failed, self.as_of)
