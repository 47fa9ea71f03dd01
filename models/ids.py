"""Stable ids and content hashes.

An id is a short hash of what makes the thing unique, so the same history always
yields the same ids (on SQLite and PostgreSQL alike) and a retried write finds the
row its first attempt committed instead of adding another.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from reverie.models.errors import NotFoundError
from reverie.models.text import clean_text

# The names a profile may have, wherever one is given (ingest, the CLI, the API).
PROFILE_NAME = re.compile(r"^[\w.@:+\-]{1,128}$")
PROFILE_CHARACTERS = "letters, digits and . _ @ : + - only"


def profile_name(name: str) -> str:
    """``name`` if a profile can have it (``given_id``'s form already); else ValueError
    saying so, the same words for ingest and the CLI."""
    if not PROFILE_NAME.match(name):
        raise ValueError(f"{name!r} is not a valid profile name ({PROFILE_CHARACTERS})")
    return name


def given_id(text: str) -> str:
    """A name someone gives Reverie (a memory's own id, a profile, a session) in the one
    form the store keeps and compares: NFC, without surrounding whitespace. Ingest
    stores names in this form and every lookup by a given name goes through it too, so
    that an id typed in another Unicode form (``"cafe\u0301"`` for ``"café"``) finds the
    same memory. ValueError if no stored name can be this text (a NUL, an unpaired
    surrogate)."""
    return clean_text(text).strip()


def sought_id(text: str, what: str) -> str:
    """``given_id(text)`` for looking a stored name up: NotFoundError ("no {what}
    '...'") when no stored name can be this text."""
    try:
        return given_id(text)
    except ValueError:
        raise NotFoundError(f"no {what} {text!r}") from None


def _digest(*parts: str) -> str:
    # Each part followed by a unit separator, hashed in one call: a full run at 100k
    # makes ~200k edge ids, and one update per part cost twice as long.
    joined = "\x1f".join(parts) + "\x1f" if parts else ""
    return hashlib.blake2b(joined.encode("utf-8"), digest_size=8).hexdigest()


def content_hash(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def memory_id_for_external(profile: str, external_id: str) -> str:
    return "m-" + _digest(profile, "external", external_id)


def memory_id_for_content(profile: str, content_sha: str, created_at_iso: str) -> str:
    return "m-" + _digest(profile, "content", content_sha, created_at_iso)


def summary_id(profile: str, operation: str, member_ids: Iterable[str]) -> str:
    """A summary is keyed by what it summarises: the same members, the same id."""
    return "m-" + _digest(profile, operation, *sorted(member_ids))


def restatement_id(memory_id: str) -> str:
    """The restatement of one memory (what it said besides an updated value): keyed by
    that memory's id alone (which names its profile already), so that recall can tell
    a restated original from its id without reading the restatement."""
    return "m-" + _digest("restate", memory_id)


def consolidation_id(profile: str, operation: str, summary: str) -> str:
    return "c-" + _digest(profile, operation, summary)


def edge_id(profile: str, kind: str, source_id: str, target_id: str) -> str:
    return "e-" + _digest(profile, kind, source_id, target_id)
