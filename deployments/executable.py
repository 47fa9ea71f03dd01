"""The ``reverie`` executable (``[project.scripts]``): the collector's pace is set before
the command line's own modules are imported, since importing typer and the CLI is where
a start first makes objects that live as long as the process (see
``YOUNG_COLLECTION_EVERY``)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from functools import wraps
from typing import NoReturn, ParamSpec, TypeVar

# CPython collects its youngest generation every 700 new objects. A command's start
# makes hundreds of thousands that live as long as the process (modules, classes,
# SQLAlchemy's and pydantic's tables of them): hundreds of collections that free
# nothing, about a tenth of `reverie status`'s CPU. Every this many instead: a few MB of
# cyclic garbage at most wait a little longer in a server. Measured: 10,000 / 20,000 /
# 50,000 leave status at 1.004 / 1.002 / 1.000 of the argparse CLI's instructions, but
# 50,000 made `reverie recall` (the model's load) about 4% dearer in CPU; 20,000 did not.
YOUNG_COLLECTION_EVERY = 20_000


def collect_less_often() -> None:
    gc.set_threshold(YOUNG_COLLECTION_EVERY, *gc.get_threshold()[1:])


P = ParamSpec("P")
R = TypeVar("R")


def unswept(command: Callable[P, R]) -> Callable[P, R]:
    """``command`` run with the cyclic collector off: for a command line whose whole run
    is a start (``cli.SHORT``): typer's parse (which imports pydantic), the store's stack
    (some 150,000 objects that live as long as the process), a few reads or one small
    write, then exit. Every collection in such a run walks objects still in use and frees
    nothing: their rows and results go by reference counting. On `reverie get`, the
    collections left at ``YOUNG_COLLECTION_EVERY`` were 2.4% of its instructions and
    about a tenth of its CPU (a walk of the heap misses the caches). A command that runs
    long (a flow, a server, a bench, an ingest) keeps the collector. Already off: its
    owner's to turn back on."""

    @wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        if not gc.isenabled():
            return command(*args, **kwargs)
        gc.disable()
        try:
            return command(*args, **kwargs)
        finally:
            gc.enable()

    return run


def console() -> NoReturn:
    collect_less_often()
    from reverie.deployments.cli import console as run

    run()
