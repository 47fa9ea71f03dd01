"""Progress bars for the long commands (ingest, backfill, bench, flows run here).

A bar is drawn on stderr, never stdout: stdout carries what a command reports (tables,
``--json``) and is often piped into a file or another program, which must get exactly
that report; stderr is where a person at a terminal looks while the command runs. A bar
is entirely quiet, not a byte written, when stderr is not a terminal: CI logs, pipes
and flow runs on a worker (whose output Prefect reads through a pipe) get no bars.

A bar's text is counts, dates, flow and step names only, never memory content nor a
profile's name: a terminal is watched, recorded and shared in screenshots.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from types import TracebackType
from typing import Any, TextIO

# When the terminal does not say how big it is (a pty nobody sized), tqdm would draw
# nothing at all: a bar zero columns wide, on a screen of no rows.
FALLBACK_COLUMNS = 80
FALLBACK_ROWS = 20
# tqdm redraws at most this often: a bar updated per record must not cost the record.
MIN_INTERVAL_SECONDS = 0.2
# A bar with nothing finished for a while (the model loading, one long flow step) is
# redrawn this often anyway, so that its elapsed time shows the command is not stuck.
TICK_SECONDS = 1.0


def on_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default: stderr as it is now) is a terminal."""
    stream = stream if stream is not None else sys.stderr
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or closed
        return False


def _columns(stream: TextIO) -> int | None:
    try:
        return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, ValueError, OSError):
        return None


class Bar:
    """A tqdm bar on ``stream`` (default stderr), drawn only if that is a terminal.

    Quiet, every method does nothing (``echo`` still prints its text), when the stream is
    not a terminal. Use it as a context manager, or ``close()`` it: a bar left open
    stays on the screen under what is printed next.
    """

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str = "it",
        stream: TextIO | None = None,
        leave: bool = False,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.active = on_terminal(self.stream)
        self._bar: Any = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if not self.active:
            return
        from tqdm import tqdm

        sized = _columns(self.stream) is not None
        self._bar = tqdm(
            total=total, desc=desc, unit=unit, file=self.stream, leave=leave,
            dynamic_ncols=sized, ncols=None if sized else FALLBACK_COLUMNS,
            nrows=None if sized else FALLBACK_ROWS, mininterval=MIN_INTERVAL_SECONDS,
        )
        _logs_above_bars(+1)
        self._ticker = threading.Thread(target=self._tick, name="progress-bar", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            bar = self._bar
            if bar is not None:
                bar.refresh()

    def update(self, n: int = 1) -> None:
        if self._bar is not None and n:
            self._bar.update(n)

    def advance_to(self, done: int) -> None:
        """Show ``done`` finished (a count kept elsewhere), never going back."""
        if self._bar is not None and done > self._bar.n:
            self._bar.update(done - self._bar.n)

    def describe(self, postfix: str) -> None:
        """A short note after the counts, e.g. ``2 waiting``; counts and names of steps
        only (see the module's docstring)."""
        if self._bar is not None:
            self._bar.set_postfix_str(postfix, refresh=False)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Clear the bars on this stream while the body writes to the terminal, then
        draw them again below what it wrote. The body holds the bars' lock, which log
        records wait for while a bar is shown: it must print, not log."""
        if self._bar is None:
            yield
            return
        with self._bar.external_write_mode(file=self.stream):
            yield

    def echo(self, text: str, file: TextIO | None = None) -> None:
        """Print a line of the command's output (default: to stdout), bar or no bar."""
        file = file if file is not None else sys.stdout
        with self.paused():
            print(text, file=file, flush=True)

    def note(self, text: str) -> None:
        """A line above the bar, shown only with it: what finished, as it finishes."""
        if self._bar is not None:
            self.echo(text, self.stream)

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self._bar is not None:
            bar, self._bar = self._bar, None
            bar.close()
            _logs_above_bars(-1)

    def __enter__(self) -> Bar:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


# --- logs while a bar is shown --------------------------------------------------------

# While any bar is drawn, the loggers that print to a terminal write through tqdm, which
# clears the bars before a record and draws them after (tqdm's own logging_redirect_tqdm):
# otherwise a log line (Prefect's, when a flow runs in this process) lands in the middle
# of the bar's line and the bar redraws over it. Entered with the first bar, left with
# the last: the loggers' handlers are then as they were.
_lock = threading.Lock()
_bars_shown = 0
_redirect: ExitStack | None = None


def _terminal_loggers() -> list[logging.Logger]:
    """The loggers with a handler printing to stdout or stderr (the handlers tqdm
    redirects) while that stream is a terminal."""
    loggers: list[logging.Logger] = [logging.getLogger()]
    loggers += [lg for lg in list(logging.Logger.manager.loggerDict.values())
                if isinstance(lg, logging.Logger)]
    return [lg for lg in loggers
            if any(_console(h) and on_terminal(h.stream)  # type: ignore[attr-defined]
                   for h in lg.handlers)]


def _console(handler: logging.Handler) -> bool:
    """What tqdm counts as a console handler (and replaces while redirecting)."""
    return (isinstance(handler, logging.StreamHandler)
            and handler.stream in (sys.stdout, sys.stderr))


@contextmanager
def _above_bars(loggers: list[logging.Logger]) -> Iterator[None]:
    from tqdm.contrib.logging import logging_redirect_tqdm

    handlers = [lg.handlers for lg in loggers]  # tqdm gives each logger a new list
    with logging_redirect_tqdm(loggers):
        # tqdm's handler takes the console handler's format, filters and stream, not
        # its level: a handler that printed only warnings must not print more now.
        for logger, before in zip(loggers, handlers, strict=True):
            console = [h for h in before if _console(h)]
            if console:
                logger.handlers[-1].setLevel(console[0].level)
        yield


def _logs_above_bars(change: int) -> None:
    """Count the bars shown; redirect the terminal's loggers with the first, restore
    them with the last."""
    global _bars_shown, _redirect
    with _lock:
        _bars_shown += change
        if _bars_shown == 1 and change > 0:
            _redirect = ExitStack()
            _redirect.enter_context(_above_bars(_terminal_loggers()))
        elif _bars_shown == 0 and _redirect is not None:
            _redirect.close()
            _redirect = None
