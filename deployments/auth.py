"""Bearer tokens for ``reverie api`` and ``reverie mcp``: each covers a list of profiles,
or every profile (the admin token).

Where tokens come from (read when a server starts; never logged, never echoed):

- ``REVERIE_API_TOKENS``: ``token1:profile1,profile2;token2:profile3``, or the same as
  JSON, ``{"token1": ["profile1", "profile2"], "token2": ["profile3"]}``;
- ``REVERIE_API_ADMIN_TOKEN``: one token for every profile;
- ``REVERIE_API_TOKENS_BLOCK``: the name of a Prefect Secret block holding tokens in the
  ``REVERIE_API_TOKENS`` format, added to the ones above.

A presented token is compared with every configured one by ``hmac.compare_digest``. A
call for a profile its token does not cover gets the same refusal whether or not the
profile exists.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from typing import Any, cast

from reverie.models.errors import ConfigError, RecordError, ReverieError
from reverie.models.settings import Settings


class UnauthorizedError(ReverieError):
    """No bearer token, or one that no configured token matches (HTTP 401)."""


class ForbiddenError(ReverieError):
    """The token does not cover the profile asked for (HTTP 403). The message is the
    same whether or not the profile exists."""


@dataclass(frozen=True)
class Principal:
    """Who a token speaks for: some profiles, or all of them (admin)."""

    profiles: frozenset[str]
    admin: bool = False

    def covers(self, profile: str) -> bool:
        return self.admin or profile in self.profiles

    def check(self, profile: str) -> None:
        if not self.covers(profile):
            raise ForbiddenError("this token does not cover the profile asked for")


@dataclass(frozen=True)
class Tokens:
    """The configured tokens. ``repr`` shows how many, never which."""

    entries: tuple[tuple[bytes, Principal], ...]

    def __repr__(self) -> str:
        return f"Tokens({len(self.entries)} configured)"

    def authenticate(self, presented: str | None) -> Principal:
        if not presented:
            raise UnauthorizedError("a bearer token is required (Authorization: Bearer ...)")
        given = presented.encode("utf-8", "surrogateescape")
        found: Principal | None = None
        for token, principal in self.entries:  # every entry: no early exit on a match
            if hmac.compare_digest(given, token) and found is None:
                found = principal
        if found is None:
            raise UnauthorizedError("the bearer token is not valid")
        return found

    def authenticate_header(self, header: str | None) -> Principal:
        """From an ``Authorization`` header's value."""
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer":
            return self.authenticate(None)
        return self.authenticate(token.strip())


def parse_tokens(text: str, where: str) -> dict[str, frozenset[str]]:
    """Tokens in the ``REVERIE_API_TOKENS`` format. Errors say where, never the token."""
    text = text.strip()
    if not text:
        return {}
    out: dict[str, frozenset[str]] = {}
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            raise ConfigError(f"{where}: not valid JSON") from None
        if not isinstance(data, dict) or not all(
            isinstance(v, list) and all(isinstance(p, str) for p in v) for v in data.values()
        ):
            raise ConfigError(f"{where}: JSON must map each token to a list of profiles")
        pairs = [(str(k), list(v)) for k, v in data.items()]
    else:
        pairs = []
        for n, part in enumerate(p for p in text.split(";") if p.strip()):
            token, sep, listed = part.partition(":")
            if not sep:
                raise ConfigError(f"{where}: entry {n + 1} is not 'token:profile,profile'")
            # Empty between commas (a trailing comma) is no name; a JSON list's "" is.
            pairs.append((token, [p for p in listed.split(",") if p.strip()]))
    for n, (token, profiles) in enumerate(pairs):
        token = token.strip()
        if len(token) < 16:
            raise ConfigError(f"{where}: token {n + 1} is shorter than 16 characters")
        names = frozenset(_profile(p, where, n + 1) for p in profiles)
        if not names:
            raise ConfigError(f"{where}: token {n + 1} covers no profile")
        out[token] = out.get(token, frozenset()) | names
    return out


def _profile(text: str, where: str, n: int) -> str:
    """A profile a token names, as every call checks it (``operations.profile_name``): a
    name no call could ever use is a mistake in the configuration, said at start rather
    than as a 422 on every call."""
    # Here, not at the top: operations imports this module.
    from reverie.deployments.operations import profile_name

    try:
        return profile_name(text)
    except RecordError as exc:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ConfigError(f"{where}: token {n}: profile {shown!r}: {exc.message}") from None


def load_tokens(settings: Settings) -> Tokens:
    """The tokens the settings (and the Secret block they name) configure."""
    entries: dict[str, Principal] = {}
    if settings.api_tokens is not None:
        for token, names in parse_tokens(settings.api_tokens.get_secret_value(),
                                         "REVERIE_API_TOKENS").items():
            entries[token] = Principal(names)
    if settings.api_tokens_block:
        where = (f"REVERIE_API_TOKENS_BLOCK (the Prefect Secret block "
                 f"{settings.api_tokens_block!r})")
        for token, names in parse_tokens(_secret_block(settings.api_tokens_block),
                                         where).items():
            previous = entries.get(token)
            entries[token] = Principal(names | (previous.profiles if previous else frozenset()))
    if settings.api_admin_token is not None:
        admin = settings.api_admin_token.get_secret_value().strip()
        if len(admin) < 16:
            raise ConfigError("REVERIE_API_ADMIN_TOKEN is shorter than 16 characters")
        entries[admin] = Principal(frozenset(), admin=True)
    if not entries:
        raise ConfigError("no API token is configured: set REVERIE_API_TOKENS, "
                          "REVERIE_API_ADMIN_TOKEN or REVERIE_API_TOKENS_BLOCK")
    return Tokens(tuple((t.encode("utf-8", "surrogateescape"), p) for t, p in entries.items()))


def _secret_block(name: str) -> str:
    from prefect.blocks.system import Secret

    try:
        # Called from sync code, Prefect's dual sync/async load returns the block itself.
        value = cast("Secret[Any]", Secret.load(name)).get()
    except Exception as exc:  # noqa: BLE001 - which block, not its value
        raise ConfigError(f"could not read the Prefect Secret block {name!r}: "
                          f"{type(exc).__name__}") from None
    return value if isinstance(value, str) else json.dumps(value)
