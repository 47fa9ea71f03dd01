"""A flow run that will not end on SIGTERM, for tests/test_serve.py.

Like the flow runs a stopped ``reverie serve`` once left behind, it ignores SIGTERM; it
also starts a child in a session of its own (out of reach of any process-group signal)
that ignores SIGTERM too. Only SIGKILL ends either. With ``stubborn=False`` both keep
SIGTERM's default action, as a well-behaved run does.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from prefect import flow

# In the child's command line, so a test can tell it from every other process.
CHILD_MARKER = "reverie-test-stubborn-child"
_CHILD = (
    "import signal, sys, time\n"
    "if sys.argv[2] == 'stubborn': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "time.sleep(float(sys.argv[3]))\n"
)


@flow
def stubborn(stubborn: bool = True, seconds: float = 600.0) -> None:
    mode = "stubborn" if stubborn else "default"
    if stubborn:
        # Before the child starts: an ignored signal stays ignored across exec, so the
        # child ignores SIGTERM from its first instruction, not only once its Python has
        # started (a test that looks at it sooner, on a loaded machine, saw it default).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", _CHILD, CHILD_MARKER, mode, str(seconds)],
                     start_new_session=True)
    time.sleep(seconds)
