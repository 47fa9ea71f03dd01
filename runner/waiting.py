"""Saying what a run waits for, while it waits.

A run waiting for a busy profile (its Prefect slot or its store lease) or for its turn
in a backfill looked, in the Prefect UI, like a run doing nothing. So it says what it
waits for when it starts waiting and again at most ``NOTICE_SECONDS`` later, for as long
as it waits: a line in the run's log and a ``reverie.run.waiting`` event on the run
(related to its store), which an automation or the UI's event feed can follow. Once a
notice per period, whatever the number of things waited for: a run waiting for a
thousand busy profiles must not write a thousand lines every poll.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from reverie.models import events
from reverie.runner.event_delivery import api_configured
from reverie.runner.runtime import flow_run_id
from reverie.tasks.step import run_logger

# What a person who ran the command in a terminal must see without -v, which hides the
# run's own log lines: the CLI gives it a handler (deployments.cli); elsewhere (a
# worker, the API server) it has none, and the run's log says the same.
CONSOLE = logging.getLogger("reverie.console")
# The longest a waiting run stays silent about it (#38: "at most every 30 s").
NOTICE_SECONDS = 30.0
WAITING_EVENT = "reverie.run.waiting"
# What one notice names, at most (the rest are counted).
NAMED = 5


def waiting_text(waits: Sequence[tuple[str, str, float]]) -> str:
    """One line for ``waits`` (what, held by whom, seconds waited so far), the longest
    waits first; the rest counted, not listed."""
    ordered = sorted(waits, key=lambda w: (-w[2], w[0]))
    named = "; ".join(f"{what}, held by {holder}, for {seconds:.0f} s"
                      for what, holder, seconds in ordered[:NAMED])
    more = f"; and {len(ordered) - NAMED} more" if len(ordered) > NAMED else ""
    return f"waiting for {len(ordered)} thing(s): {named}{more}"


class WaitNotice:
    """Tells, at most once per ``every`` seconds, what the run is still waiting for.

    ``clock`` is injectable so that tests need not sleep."""

    def __init__(self, store_id: str, every: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store_id, self.clock = store_id, clock
        self.every = NOTICE_SECONDS if every is None else every
        self.last: float | None = None
        self.sent = 0

    def mark(self) -> None:
        """The run has just said what it waits for in its own words: the next notice is
        due a period from now."""
        self.last = self.clock()

    def due(self) -> bool:
        return self.last is None or self.clock() - self.last >= self.every

    def tell(self, waits: Sequence[tuple[str, str, float]]) -> bool:
        """Say what is waited for, if a notice is due; True if one was given."""
        if not waits or not self.due():
            return False
        self.last = self.clock()
        self.sent += 1
        text = waiting_text(waits)
        run_logger().info("%s", text)
        CONSOLE.info("%s", text)
        self._event(text, waits)
        return True

    def _event(self, text: str, waits: Sequence[tuple[str, str, float]]) -> None:
        run_id = flow_run_id()
        if run_id is None or not api_configured():
            return
        from prefect.events import emit_event

        try:
            emit_event(
                event=WAITING_EVENT,
                resource={"prefect.resource.id": f"prefect.flow-run.{run_id}"},
                related=events.related(self.store_id),
                payload={"text": text, "count": len(waits),
                         "waits": [{"for": what, "holder": holder, "seconds": round(s, 1)}
                                   for what, holder, s in waits[:NAMED]]},
            )
        except Exception as exc:  # noqa: BLE001 - the log line said it already
            run_logger().debug("could not emit the waiting event: %s", exc)
