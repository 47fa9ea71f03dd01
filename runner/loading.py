"""Loading Prefect and a flow into a command's process without the garbage collector's
full sweeps.

Importing Prefect and a flow's modules makes some 200,000 objects that live as long as
the process. While they are made, the cyclic collector's oldest generation fills up and
each full collection walks all of them again: about 0.2 s of CPU in a local command,
that collects nothing (modules, classes and their schemas are all still in use).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from reverie.models.repositories.bulk import collector_paused


@contextmanager
def first_load() -> Iterator[None]:
    """Run the ``with`` (the imports of a flow run) with the collector off, then move
    every object alive into the permanent generation (``gc.freeze``) so that the run's
    own collections no longer walk them, and turn the collector back on.

    Only the first time in a process, before Prefect is loaded: a process that already
    has it (a server, a worker, a test session) gains nothing, and freezing there would
    also keep whatever garbage it holds at that moment for good. Nothing happens either
    when the collector is already off (its owner turns it back on)."""
    if "prefect" in sys.modules or not gc.isenabled():
        yield
        return
    with collector_paused():
        try:
            yield
        finally:
            gc.freeze()  # before the collector is back on
