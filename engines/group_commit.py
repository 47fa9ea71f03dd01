"""Group commit: callers hand in a job each; whoever gets a free slot runs every job
waiting (of its key, up to a size limit) as one, and each caller gets its own answer.

A server's concurrent calls (store calls, embedding batches) cost mostly per call: a
transaction, a read, a small inference batch. Run together they pay it once.

Waiting callers are woken when their job is done, not when they get the slot in turn:
with a plain lock, answered callers queued behind the next writer to learn so, and
under 8 clients most groups were of 2 calls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")


class GroupAborted(RuntimeError):
    """A job's group was stopped by a BaseException that is not an Exception (such as
    KeyboardInterrupt or SystemExit) in the thread running it; it is the ``__cause__``.
    The running thread gets the BaseException itself."""


@dataclass(frozen=True)
class Failure:
    """What ``run`` gives for a job that failed on its own: its caller raises ``error``."""

    error: BaseException


@dataclass(eq=False)
class _Job(Generic[T]):
    item: T
    size: int
    seq: int
    taken: bool = False
    done: bool = False
    result: object = None
    error: BaseException | None = None


class GroupCommit(Generic[T, R]):
    """``submit(item)`` returns ``run``'s answer for ``item``, run with the items of
    other callers waiting meanwhile.

    ``run(slot, items)`` gets the items in the order they were submitted and returns one
    answer per item, or a ``Failure`` for an item that failed alone. An exception from
    ``run`` itself reaches every caller of the group. ``slots`` groups may run at once
    (each with its own slot number, ``0 .. slots - 1``); ``limit`` bounds a group's
    total ``size`` (a caller's own job always goes in); ``key`` keeps jobs that may
    not be run together apart. ``take_slot``/``give_slot`` let other work use a slot."""

    def __init__(self, run: Callable[[int, list[T]], Sequence[R | Failure]], slots: int = 1,
                 limit: int | None = None, gather: float = 0.0) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        if gather < 0:
            raise ValueError("gather must not be negative")
        self._run = run
        self._limit = limit
        self._gather = gather
        # Callers seen at once when the last group ended: its jobs and those queued
        # behind it. The next runner gathers for as many. The last group's size alone
        # ratcheted down: 8 clients split 5 and 3 once, and each part then gathered
        # only its own size, so the groups stayed at 5 and 3.
        self._last = 1
        self.groups = 0  # groups run, and the jobs in them (to see that calls coalesce)
        self.jobs = 0
        self._changed = threading.Condition()
        self._idle = list(range(slots))
        self._queued: dict[Hashable, list[_Job[T]]] = {}
        self._seq = 0

    def submit(self, item: T, key: Hashable = None, size: int = 1) -> R:
        with self._changed:
            self._seq += 1
            job = _Job(item, size, self._seq)
            self._queued.setdefault(key, []).append(job)
            if self._gather:
                self._changed.notify_all()  # a runner may be gathering
            try:
                while not job.taken and not self._idle:
                    self._changed.wait()
                if job.taken:
                    while not job.done:
                        self._changed.wait()
                    return self._answer(job, runner=False)
            except BaseException:
                # Interrupted while waiting: a job nobody took yet is withdrawn (one
                # taken is run anyway, and its answer is dropped).
                if not job.taken:
                    self._withdraw(key, job)
                raise
            slot = self._idle.pop()
            if self._gather and self._last > 1:
                try:
                    self._wait_for_more(key)
                except BaseException:
                    # Interrupted while gathering: the slot back, the job withdrawn.
                    self._withdraw(key, job)
                    self._idle.append(slot)
                    self._changed.notify_all()
                    raise
            group = self._group(key, job)
            self.groups += 1
            self.jobs += len(group)
        try:
            answers = self._run(slot, [j.item for j in group])
            if len(answers) != len(group):
                raise RuntimeError(f"run gave {len(answers)} answers for {len(group)} jobs")
            for j, answer in zip(group, answers, strict=True):
                if isinstance(answer, Failure):
                    j.error = answer.error
                else:
                    j.result = answer
        except BaseException as exc:
            for j in group:
                j.error = exc
        finally:
            with self._changed:
                for j in group:
                    j.done = True
                self._last = len(group) + len(self._queued.get(key, ()))
                self._idle.append(slot)
                self._changed.notify_all()
        return self._answer(job, runner=True)

    def _wait_for_more(self, key: Hashable) -> None:
        """Until ``key`` has as many jobs waiting as there were callers when the last
        group ended, or ``gather`` is over; the caller holds the lock (released while
        waiting)."""
        deadline = time.monotonic() + self._gather
        while len(self._queued.get(key, ())) < self._last:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._changed.wait(left)

    def _group(self, key: Hashable, job: _Job[T]) -> list[_Job[T]]:
        """The jobs of ``key`` to run with ``job``, in order; the caller holds the lock."""
        waiting = self._queued.pop(key)
        room = None if self._limit is None else self._limit - job.size
        group: list[_Job[T]] = []
        left: list[_Job[T]] = []
        for j in waiting:
            if j is job:
                group.append(j)
            elif room is None or j.size <= room:
                group.append(j)
                if room is not None:
                    room -= j.size
            else:
                left.append(j)
        if left:
            self._queued[key] = left
        for j in group:
            j.taken = True
        return group

    def _withdraw(self, key: Hashable, job: _Job[T]) -> None:
        waiting = [j for j in self._queued.get(key, []) if j is not job]
        if waiting:
            self._queued[key] = waiting
        else:
            self._queued.pop(key, None)

    @staticmethod
    def _answer(job: _Job[T], runner: bool) -> R:
        error = job.error
        if error is None:
            return cast(R, job.result)
        if isinstance(error, Exception) or runner:
            raise error
        raise GroupAborted(f"the group was stopped ({type(error).__name__})") from error

    def take_slot(self) -> int:
        """A slot for work of the caller's own, once one is free."""
        with self._changed:
            while not self._idle:
                self._changed.wait()
            return self._idle.pop()

    def give_slot(self, slot: int) -> None:
        with self._changed:
            self._idle.append(slot)
            self._changed.notify_all()

    @contextmanager
    def slot(self) -> Iterator[int]:
        k = self.take_slot()
        try:
            yield k
        finally:
            self.give_slot(k)
