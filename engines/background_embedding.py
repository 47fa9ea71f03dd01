"""Texts embedded on a worker thread while the caller goes on planning, wording and
writing: the model keeps both cores busy, and the store's work, which uses one, fits
beside it instead of after it.

A step hands in each text as soon as it is worded (``add``), says when there are no
more (``close``), and asks for the vectors last (``vectors``), by which time most of
them are done. The worker loads the model on the first text (so loading, too, happens
while the step plans) and embeds what has been handed in, a chunk at a time: its
first chunk as soon as ``MIN_CHUNK`` texts wait (or the last was handed in), each
later one as all that waited meanwhile, at most ``MAX_CHUNK``, so that length-bucketed
batches stay full and a failure waits for at most one chunk. ``seconds_left`` tells,
from the pace so far, how long the rest will take; a step starts its write when that
is about as long as the write itself (the setting ``write_ahead_seconds``), so that
the write's lock is held little longer than the write alone would hold it.

The vectors are the embedder's own, row for row: a chunk is one ``encode`` call, and
``encode`` pads each batch only to its own longest text.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

import numpy as np

from reverie.engines.embedding import Embedder
from reverie.models.vectors import to_blob

# Texts the first chunk waits for: a few full batches, not one text at a time.
MIN_CHUNK = 256
# Texts per chunk at most: how long a failed step may wait for the chunk in flight.
MAX_CHUNK = 4096


class BackgroundEmbedding:
    """Embeddings of texts handed in one by one, computed on a worker thread.

    ``load``: returns the embedder (called once, on the worker, on the first text).
    Use as a context manager: leaving the block stops the worker after its chunk in
    flight, so nothing of a failed step is still running when the next attempt begins.
    """

    def __init__(self, load: Callable[[], Embedder]) -> None:
        self._load = load
        self._keys: list[str] = []
        self._texts: list[str] = []
        self._rows: list[np.ndarray] = []  # one block per chunk, in the order handed in
        self._taken = 0  # texts given to the worker so far
        self._done = 0  # texts embedded so far (batch by batch: the pace)
        self._stored = 0  # texts whose rows are in _rows
        self._busy = 0.0  # seconds the worker spent embedding
        self._closed = False
        self._stopped = False
        self._error: BaseException | None = None
        self._name: str | None = None
        self._blobs: dict[str, bytes] | None = None
        self._changed = threading.Condition()
        self._worker: threading.Thread | None = None

    # --- the caller's side -------------------------------------------------------------

    def add(self, key: str, text: str) -> None:
        """Hand in ``text``, whose vector ``vectors`` will give under ``key``."""
        with self._changed:
            if self._closed:
                raise RuntimeError("add after close")
            self._keys.append(key)
            self._texts.append(text)
            self._changed.notify_all()
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="reverie-embedding",
                                            daemon=True)
            self._worker.start()

    def close(self) -> None:
        """No more texts: the worker embeds what is left without waiting for more."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    @property
    def pending(self) -> int:
        """Texts handed in and not embedded yet."""
        return len(self._texts) - self._done

    @property
    def seconds(self) -> float:
        """Seconds the worker has spent embedding (loading the model not included)."""
        return self._busy

    def seconds_left(self) -> float | None:
        """How long the texts not yet embedded will take at the pace so far; None
        before the first batch is done (no pace yet), 0 when nothing is left."""
        with self._changed:
            return self._seconds_left()

    def wait(self, seconds_left: float = 0.0) -> None:
        """Return once ``close`` was called and the rest will take at most
        ``seconds_left`` by the pace so far (0: all embedded). Raises what the worker
        raised."""
        with self._changed:
            while True:
                if self._error is not None:
                    raise self._error
                left = self._seconds_left()
                if self._closed and (self._stored == len(self._texts) or (
                        seconds_left > 0 and left is not None and left <= seconds_left)):
                    return
                self._changed.wait()

    def model_name(self) -> str | None:
        """The embedder's name once it is loaded (None when nothing was handed in);
        waits for the load."""
        with self._changed:
            while self._texts and self._name is None:
                if self._error is not None:
                    raise self._error
                self._changed.wait()
            return self._name

    def vectors(self) -> dict[str, bytes]:
        """Every vector, as stored (``to_blob``), by key; waits for the last of them."""
        self.close()
        self.wait()
        if self._blobs is None:
            rows = np.concatenate(self._rows) if self._rows else np.zeros((0, 0), np.float32)
            self._blobs = {key: to_blob(row) for key, row in zip(self._keys, rows, strict=True)}
        return self._blobs

    def __enter__(self) -> BackgroundEmbedding:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        if self._worker is not None:
            self._worker.join()

    # --- the worker's side -------------------------------------------------------------

    def _seconds_left(self) -> float | None:
        if self.pending == 0:
            return 0.0
        if self._done == 0 or self._busy <= 0:
            return None
        return self.pending * self._busy / self._done

    def _next_chunk(self) -> list[str] | None:
        """The texts to embed next, waiting until enough are there; None: stop."""
        with self._changed:
            while True:
                if self._stopped:
                    return None
                waiting = len(self._texts) - self._taken
                enough = MIN_CHUNK if self._taken == 0 else 1
                if waiting >= enough or (self._closed and waiting):
                    chunk = self._texts[self._taken:self._taken + MAX_CHUNK]
                    self._taken += len(chunk)
                    return chunk
                if self._closed:
                    return None
                self._changed.wait()

    def _work(self) -> None:
        try:
            embedder = self._load()
            with self._changed:
                self._name = embedder.name
                self._changed.notify_all()
            while (chunk := self._next_chunk()) is not None:
                started, done_before, busy_before = time.perf_counter(), self._done, self._busy
                rows = embedder.encode(chunk, progress=self._paced(started, busy_before))
                with self._changed:
                    self._rows.append(rows)
                    self._stored += len(chunk)
                    self._done = done_before + len(chunk)
                    self._busy = busy_before + time.perf_counter() - started
                    self._changed.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
            with self._changed:
                self._error = exc
                self._changed.notify_all()

    def _paced(self, started: float, busy_before: float) -> Callable[[int], None]:
        """A progress callback that keeps the pace current while a chunk runs."""

        def batch_done(texts: int) -> None:
            with self._changed:
                self._done += texts
                self._busy = busy_before + time.perf_counter() - started
                self._changed.notify_all()

        return batch_done
