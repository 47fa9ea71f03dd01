"""Reverie's errors as the HTTP statuses (and MCP tool errors) the agent servers give.

Everything the caller can fix is a 4xx whose body names the field when there is one;
a store that is busy or down is a 503 (try again). Bodies hold Reverie's messages,
which name records and fields, never memory content.
"""

from __future__ import annotations

from typing import Any

from reverie.deployments.auth import ForbiddenError, UnauthorizedError
from reverie.models.errors import (
    ConfigError,
    InputError,
    NotFoundError,
    RecordError,
    RefusedError,
    ReverieError,
    StorePermanentError,
    StoreRetryableError,
    TransientError,
)


class PayloadTooLargeError(InputError):
    """A request body over ``REVERIE_API_MAX_BODY_BYTES``."""


def field_error(field: str, message: str) -> RecordError:
    """An error of one field of a request."""
    return RecordError("request", field, message)


def status_of(exc: ReverieError) -> int:
    if isinstance(exc, UnauthorizedError):
        return 401
    if isinstance(exc, ForbiddenError):
        return 403
    if isinstance(exc, PayloadTooLargeError):
        return 413
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, RefusedError):
        return 409
    if isinstance(exc, InputError | ConfigError | StorePermanentError):
        return 422
    if isinstance(exc, StoreRetryableError | TransientError):
        return 503
    return 400


class RecordsRefused(RecordError):
    """A store call none of whose records was stored: named by its first refusal, with
    every refusal in ``rejected`` (record, field, message), as a call that stored some
    answers them, so that a caller can mend them all at once."""

    def __init__(self, rejected: list[dict[str, Any]]) -> None:
        first = rejected[0]
        super().__init__(first["record"], first["field"] or "memories",
                         f"{first['message']} (no record of the call was stored: "
                         f"{len(rejected)} refused)")
        self.rejected = rejected


def body_of(exc: ReverieError) -> dict[str, Any]:
    body: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, RecordError):
        body["field"] = exc.field
        body["message"] = exc.message if exc.where == "request" else str(exc)
    if isinstance(exc, RecordsRefused):
        body["rejected"] = exc.rejected
    return body
