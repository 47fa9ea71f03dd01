"""The ``reverie`` executable (``[project.scripts]``): the collector's pace is set before
the command line's own modules are imported, since importing typer and the CLI is where
a start first makes objects that live as long as the process (see
``YOUNG_COLLECTION_EVERY``)."""

from __future__ import annotations

import gc
from typing import NoReturn

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


def console() -> NoReturn:
    collect_less_often()
    from reverie.deployments.cli import console as run

    run()
