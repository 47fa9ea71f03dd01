"""Times in the store are naive UTC; these turn what callers give into that."""

from __future__ import annotations

from datetime import UTC, date, datetime


def to_utc_naive(value: datetime) -> datetime:
    """A timezone-aware time converted to UTC; a naive one is taken as UTC already."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


def parse_timestamp(value: object) -> datetime:
    """An ISO-8601 date or date-time (``Z`` or an offset allowed) as naive UTC.

    Raises ValueError with a message fit for the user on anything else.
    """
    if isinstance(value, datetime):
        return to_utc_naive(value)
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
    return to_utc_naive(parsed)


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
