"""``engines.group_commit``: every job answered with its own answer, in order, none lost;
errors reach every caller of the group, a BaseException included; slots, keys, limits
and the gathering of callers that come back together."""

import threading
import time
from collections.abc import Callable

import pytest

from reverie.engines.group_commit import Failure, GroupAborted, GroupCommit


class Recorder:
    """A ``run`` that records its groups and answers each item doubled; it can be held
    (to let callers queue up behind it) and told to fail."""

    def __init__(self, fail: Callable[[int], BaseException | None] = lambda _: None) -> None:
        self.groups: list[list[int]] = []
        self.slots: list[int] = []
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()
        self.fail = fail
        self.lock = threading.Lock()
        self.queued: list[int] = []  # the order the held group's followers queued in

    def __call__(self, slot: int, items: list[int]) -> list[int | Failure]:
        with self.lock:
            self.groups.append(list(items))
            self.slots.append(slot)
        self.entered.set()
        self.release.wait(10)
        answers: list[int | Failure] = []
        for item in items:
            error = self.fail(item)
            if error is not None and item < 0:
                raise error  # the whole group fails
            answers.append(Failure(error) if error is not None else item * 2)
        return answers


def run_threads(commit: GroupCommit[int, int], items: list[int]) -> dict[int, object]:
    """Each item submitted from a thread of its own: its answer or what it raised."""
    got: dict[int, object] = {}

    def one(item: int) -> None:
        try:
            got[item] = commit.submit(item)
        except BaseException as exc:  # noqa: BLE001 - what the caller saw
            got[item] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads)
    return got


def queued_behind_a_held_group(commit: GroupCommit[int, int], run: Recorder, first: int,
                               items: list[int]) -> dict[int, object]:
    """``first`` runs alone and is held until ``items`` are all waiting; then all go."""
    run.release.clear()
    got: dict[int, object] = {}
    lead = threading.Thread(target=lambda: got.__setitem__(first, commit.submit(first)))
    lead.start()
    assert run.entered.wait(10)
    waiting = threading.Thread(target=lambda: got.update(run_threads(commit, items)))
    waiting.start()
    deadline = time.monotonic() + 10
    while sum(len(q) for q in commit._queued.values()) < len(items):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    run.queued = [j.item for q in commit._queued.values() for j in q]
    run.release.set()
    lead.join(10)
    waiting.join(20)
    return got


def test_each_caller_gets_its_own_answer_and_no_job_is_lost() -> None:
    run = Recorder()
    commit: GroupCommit[int, int] = GroupCommit(run)
    items = list(range(1, 200))
    got = run_threads(commit, items)
    assert got == {i: i * 2 for i in items}
    assert sorted(i for g in run.groups for i in g) == items  # each run once
    assert commit.jobs == len(items)


def test_callers_waiting_meanwhile_run_as_one_group_in_the_order_they_came() -> None:
    run = Recorder()
    commit: GroupCommit[int, int] = GroupCommit(run)
    got = queued_behind_a_held_group(commit, run, 100, list(range(1, 9)))
    assert got == {i: i * 2 for i in [100, *range(1, 9)]}
    assert run.groups[0] == [100]
    assert sorted(run.groups[1]) == list(range(1, 9))
    # One group, in the order they were submitted.
    assert len(run.groups) == 2 and run.groups[1] == run.queued


def test_a_failure_of_one_job_reaches_only_its_caller() -> None:
    run = Recorder(fail=lambda i: ValueError(f"bad {i}") if i == 3 else None)
    commit: GroupCommit[int, int] = GroupCommit(run)
    got = queued_behind_a_held_group(commit, run, 100, [1, 2, 3, 4])
    assert isinstance(got[3], ValueError) and str(got[3]) == "bad 3"
    assert {i: got[i] for i in (1, 2, 4, 100)} == {1: 2, 2: 4, 4: 8, 100: 200}


def test_an_exception_of_the_whole_group_reaches_every_caller() -> None:
    boom = RuntimeError("the transaction failed")
    run = Recorder(fail=lambda i: boom if i == -1 else None)
    commit: GroupCommit[int, int] = GroupCommit(run)
    got = queued_behind_a_held_group(commit, run, 100, [1, -1, 2])
    assert got[100] == 200
    assert got[1] is boom and got[-1] is boom and got[2] is boom
    # The slot is free again: the next call runs.
    assert commit.submit(5) == 10


def test_a_base_exception_in_the_running_thread_reaches_every_caller() -> None:
    """A KeyboardInterrupt-like BaseException while a group runs: the running thread
    gets it as it is, every other caller of the group a GroupAborted caused by it (it
    used to get an assertion), and later calls still run."""

    class Interrupt(BaseException):
        pass

    stop = Interrupt()
    run = Recorder(fail=lambda i: stop if i == -1 else None)
    commit: GroupCommit[int, int] = GroupCommit(run)
    got = queued_behind_a_held_group(commit, run, 100, [1, -1, 2, 3])
    runner = next(i for i in (1, -1, 2, 3) if got[i] is stop)  # whoever ran the group
    for i in (1, -1, 2, 3):
        if i != runner:
            assert isinstance(got[i], GroupAborted)
            assert got[i].__cause__ is stop
    assert got[100] == 200
    assert commit.submit(7) == 14
    assert not commit._queued


def test_a_caller_interrupted_while_waiting_withdraws_its_job() -> None:
    run = Recorder()
    run.release.clear()
    commit: GroupCommit[int, int] = GroupCommit(run)
    lead = threading.Thread(target=commit.submit, args=(1,))
    lead.start()
    assert run.entered.wait(10)

    class Interrupt(BaseException):
        pass

    waits = 0
    original = commit._changed.wait

    def interrupted(timeout: float | None = None) -> bool:
        nonlocal waits
        waits += 1
        raise Interrupt

    commit._changed.wait = interrupted  # type: ignore[method-assign]
    with pytest.raises(Interrupt):
        commit.submit(2)
    commit._changed.wait = original  # type: ignore[method-assign]
    assert waits == 1 and not commit._queued  # withdrawn: nobody runs it unasked
    run.release.set()
    lead.join(10)
    assert run.groups == [[1]]


def test_slots_run_groups_side_by_side_and_keys_and_limits_keep_jobs_apart() -> None:
    run = Recorder()
    commit: GroupCommit[int, int] = GroupCommit(run, slots=2, limit=3)
    run.release.clear()
    holders = [threading.Thread(target=commit.submit, args=(i,)) for i in (100, 200)]
    for t in holders:
        t.start()
    deadline = time.monotonic() + 10
    while len(run.groups) < 2:  # both slots busy at once
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert sorted(run.slots) == [0, 1]
    got: dict[int, object] = {}

    def submit(item: int, key: int) -> None:
        got[item] = commit.submit(item, key=key)

    waiting = [threading.Thread(target=submit, args=(i, i % 2)) for i in range(1, 9)]
    for t in waiting:
        t.start()
    while sum(len(q) for q in commit._queued.values()) < 8:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    run.release.set()
    for t in [*holders, *waiting]:
        t.join(10)
    assert got == {i: i * 2 for i in range(1, 9)}
    for group in run.groups[2:]:
        assert len(group) <= 3 and len({i % 2 for i in group}) == 1


def test_other_work_can_take_a_slot() -> None:
    run = Recorder()
    commit: GroupCommit[int, int] = GroupCommit(run)
    with commit.slot():
        done = threading.Event()
        t = threading.Thread(target=lambda: (commit.submit(1), done.set()))
        t.start()
        assert not done.wait(0.2)  # waits for the slot
    t.join(10)
    assert done.is_set() and run.groups == [[1]]


def test_callers_answered_together_are_gathered_into_the_next_group() -> None:
    """The callers seen at once are gathered: a group of 1 ends with 3 queued behind it,
    so the next waits (up to ``gather``) for the first caller to come back and runs 4,
    not 3 (groups gathered to the last group's size stayed split, at 5 and 3 of 8
    clients); after that group of 4, the first caller back waits for the other three
    instead of running alone."""
    run = Recorder()
    commit: GroupCommit[int, int] = GroupCommit(run, gather=5.0)
    began = time.monotonic()
    run.release.clear()
    # The first caller comes back a little later: without gathering, 1, 2 and 3 would
    # have run without it.
    lead = threading.Thread(target=lambda: (commit.submit(100), time.sleep(0.2),
                                            commit.submit(104)))
    lead.start()
    assert run.entered.wait(10)
    waiting = threading.Thread(target=lambda: run_threads(commit, [1, 2, 3]))
    waiting.start()
    deadline = time.monotonic() + 10
    while len(commit._queued.get(None, ())) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    run.release.set()
    lead.join(10)
    waiting.join(20)
    assert run.groups[0] == [100] and sorted(run.groups[1]) == [1, 2, 3, 104]
    assert time.monotonic() - began < 4  # gathered as soon as the fourth was back
    began = time.monotonic()

    def back(i: int) -> int:
        time.sleep(0.05 * (i - 10))  # the others come back a little later
        return commit.submit(i)

    got: dict[int, int] = {}
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, back(i)))
               for i in (10, 11, 12, 13)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert got == {i: i * 2 for i in (10, 11, 12, 13)}
    assert sorted(run.groups[-1]) == [10, 11, 12, 13]
    assert time.monotonic() - began < 4  # gathered as soon as all four were back


def test_a_lone_caller_does_not_wait() -> None:
    run = Recorder()
    commit: GroupCommit[int, int] = GroupCommit(run, gather=5.0)
    began = time.monotonic()
    for i in range(5):
        assert commit.submit(i) == i * 2
    assert time.monotonic() - began < 2
    assert commit.groups == 5


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="slots"):
        GroupCommit(Recorder(), slots=0)
    with pytest.raises(ValueError, match="gather"):
        GroupCommit(Recorder(), gather=-1)
    commit: GroupCommit[int, int] = GroupCommit(lambda _slot, items: [])
    with pytest.raises(RuntimeError, match="0 answers for 1 jobs"):
        commit.submit(1)


def test_a_runner_interrupted_while_gathering_gives_its_slot_back() -> None:
    run = Recorder()
    commit: GroupCommit[int, int] = GroupCommit(run, gather=0.2)
    queued_behind_a_held_group(commit, run, 100, [1, 2])  # the last group had 2 jobs

    class Interrupt(BaseException):
        pass

    original = commit._changed.wait

    def interrupted(timeout: float | None = None) -> bool:
        raise Interrupt

    commit._changed.wait = interrupted  # type: ignore[method-assign]
    with pytest.raises(Interrupt):
        commit.submit(3)  # takes the slot, then waits for a second job
    commit._changed.wait = original  # type: ignore[method-assign]
    assert not commit._queued and commit._idle == [0]
    assert commit.submit(4) == 8
