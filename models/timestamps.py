"""Times in the store are naive UTC; these turn what callers give into that."""

from __future__ import annotations

from datetime import UTC, date, datetime

# The times a record may carry. Steps do date arithmetic on them: they add and
# subtract days and ages, and take naive timestamps (local time, which C's mktime
# must handle). Near the ends of Python's range (years 1 and 9999) that overflows
# ("year 0 is out of range"). No memory is dated before 1900, and a validity that
# runs to 2200 means "for good"; both ends stay centuries clear of every limit
# (Python's datetime, the platform's time functions, PostgreSQL's timestamp).
EARLIEST_TIME = datetime(1900, 1, 1)
LATEST_TIME = datetime(2200, 12, 31, 23, 59, 59, 999_999)
# Every rule speaks in days; every elapsed time is turned into them here.
DAY_SECONDS = 86_400.0


def days_between(earlier: datetime, later: datetime) -> float:
    """Days from ``earlier`` to ``later`` (negative if ``later`` comes first)."""
    return (later - earlier).total_seconds() / DAY_SECONDS


def to_utc_naive(value: datetime) -> datetime:
    """A timezone-aware time converted to UTC; a naive one is taken as UTC already.

    Always a plain ``datetime``: Prefect hands a run's scheduled start over as a
    subclass (pendulum's or whenever's DateTime), and database drivers look adapters up
    by exact type, so sqlite3 refuses such a value ("type 'DateTime' is not supported").
    """
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return datetime(value.year, value.month, value.day, value.hour, value.minute,
                    value.second, value.microsecond)


def parse_timestamp(value: object) -> datetime:
    """An ISO-8601 date or date-time (``Z`` or an offset allowed) as naive UTC.

    Raises ValueError with a message fit for the user on anything else.
    """
    if isinstance(value, datetime):
        return _utc(value)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    if not isinstance(value, str):
        raise ValueError(f"expected an ISO-8601 date-time string, got {type(value).__name__}")
    text = value.strip()
    if not text:
        raise ValueError("expected an ISO-8601 date-time string, got an empty string")
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"not an ISO-8601 date-time: {text[:40]!r}") from None
    return _utc(parsed)


def _utc(value: datetime) -> datetime:
    try:
        return to_utc_naive(value)
    except OverflowError:  # an offset that moves year 1 or 9999 past Python's range
        raise ValueError(_RANGE_MESSAGE) from None


_RANGE_MESSAGE = (
    f"must be between {EARLIEST_TIME.year} and {LATEST_TIME.year} (inclusive, in UTC)"
)


def in_record_range(value: datetime) -> datetime:
    """``value`` if a record may carry it (see EARLIEST_TIME); ValueError otherwise."""
    if not EARLIEST_TIME <= value <= LATEST_TIME:
        raise ValueError(_RANGE_MESSAGE)
    return value


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
