"""The parameters every Reverie flow takes, described and constrained once.

Prefect builds a deployment's run form and its parameter schema from these: the
descriptions are the form's help text, and with ``enforce_parameter_schema`` the
server refuses a run whose profile or as_of is malformed when it is created, not
when it starts.

Each flow still spells out its own signature with these types, though the signatures
look alike: ``prefect deploy`` builds a deployment's schema from the source text of the
function that prefect.yaml's entrypoint names (Prefect's
``parameter_schema_from_entrypoint`` reads the file, it does not import it), so a flow
made by a factory would deploy with no parameters.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, TypeVar

from pydantic import Field
from pydantic.fields import FieldInfo

from reverie.models.config import ConsolidationConfig
from reverie.models.ids import PROFILE_NAME

F = TypeVar("F", bound=Callable[..., object])

# ISO-8601 as Prefect's form and the CLI send it: a date, or a date-time with an
# optional fraction and zone. JSON Schema's own "date-time" format is only checked
# when an optional package is installed on the server; a pattern always is.
ISO_8601 = (r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?"
            r"(Z|[+-]\d{2}(:?\d{2})?)?)?$")

ProfileName = Annotated[str, Field(pattern=PROFILE_NAME.pattern, max_length=128)]

Profile = Annotated[
    ProfileName | list[ProfileName] | None,
    Field(description=(
        "The profile(s) to work on: one name, a list of names, or empty for every "
        "profile in the store. Names use letters, digits and . _ @ : + - only."
    )),
]

AsOf = Annotated[
    datetime | None,
    Field(
        description=(
            "The moment the run acts as of (UTC when no zone is given): ages, decay "
            "and 'stale' are measured to it. Empty: the run's scheduled start, so a "
            "late, retried or backfilled run replays its own date."
        ),
        json_schema_extra={"pattern": ISO_8601},
    ),
]

DryRun = Annotated[bool, Field(description=(
    "Run every step on a scratch copy of the selected profiles and report what would "
    "change; the store is not written."
))]

Config = Annotated[ConsolidationConfig | None, Field(description=(
    "Every knob of every step (thresholds, sizes, windows), each described below. Empty: "
    "the preset the environment names (REVERIE_PRESET: default, conservative, "
    "aggressive, archive-faded, forget-by-risk)."
))]

StoreId = Annotated[str | None, Field(max_length=64, description=(
    "Set by the deployment's event triggers: the id of the store whose event started the "
    "run. A run refuses to start when it is not the id of the store it would work on "
    "(REVERIE_DATABASE_URL). Empty (by hand, on a schedule): no check."
))]

ArchiveBelow = Annotated[float | None, Field(ge=0.0, le=1.0, description=(
    "Archive (move to the cold tier, kept and undoable) live memories whose relevance is "
    "below this; 0.0 archives nothing. Empty: config.forget.archive_threshold."
))]

DeleteBelow = Annotated[float | None, Field(ge=0.0, le=1.0, description=(
    "Delete (leaving a tombstone) live memories whose relevance is below this; 0.0 "
    "deletes nothing. Empty: config.forget.delete_threshold."
))]


def documented(fn: F) -> F:
    """Give ``fn`` a Google-style ``Args:`` section made from its parameters' Field
    descriptions. Prefect's form takes a parameter's help from the docstring: it builds
    each parameter's field afresh and drops the description an ``Annotated`` type
    carries. One source, the types above, serves both."""
    hints = typing.get_type_hints(fn, include_extras=True)
    lines = []
    for name in inspect.signature(fn).parameters:
        described = [m.description for m in getattr(hints.get(name), "__metadata__", ())
                     if isinstance(m, FieldInfo) and m.description]
        if described:
            lines.append(f"    {name}: {described[-1]}")
    if lines:
        fn.__doc__ = (inspect.cleandoc(fn.__doc__ or "") + "\n\nArgs:\n" + "\n".join(lines))
    return fn
