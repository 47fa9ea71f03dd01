"""Which run may consolidate a profile right now: at most one at a time.

Two guards, always taken together: a Prefect global concurrency limit per store and
profile (``reverie-profile-<store id>-<name>``, one slot) when a Prefect API is
configured, so that two stores' profiles of the same name on one Prefect never wait for
each other, and a lease
in the store for runs outside Prefect. Both are leases that a live run keeps renewing
(a heartbeat thread) and that expire on their own when it dies: a run killed with its
server frees its profiles within a lease. Prefect's leases survive a server restart
only with its filesystem lease storage (``reverie serve`` sets it); with the in-memory
default a restart forgets them while the limit stays occupied.

A run takes profiles without ever waiting while it holds one it is not working on:
``take`` never blocks, and the caller gives back each chunk as soon as its steps are
done. So two runs can never deadlock, and a busy profile holds up nothing but itself.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Mapping, Sequence
from uuid import UUID

from reverie.models.errors import HoldUnavailableError
from reverie.models.repositories.runs import (
    acquire_leases,
    expired_leases,
    lease_holders,
    release_leases,
    renew_leases,
)
from reverie.models.store import Store
from reverie.models.timestamps import utcnow
from reverie.runner.event_delivery import api_configured
from reverie.runner.runtime import flow_run_id
from reverie.tasks.step import run_logger

log = logging.getLogger(__name__)

PROFILE_LIMIT_PREFIX = "reverie-profile-"
# Profiles taken in one go (one Prefect request, one transaction).
TAKE_CHUNK = 100
PREFECT_MIN_LEASE_SECONDS = 60.0
LIMITS_PAGE = 200


def limit_name(store_id: str, profile: str) -> str:
    """The Prefect limit of ``profile`` in the store ``store_id``: two tenants' stores may
    both have a profile called ``maya``, and their runs must not queue behind each other."""
    return f"{PROFILE_LIMIT_PREFIX}{store_id}-{profile}"


class ProfileHolds:
    """The profiles one run holds, taken and given back chunk by chunk.

    ``holder`` is what the store's lease records: the Prefect flow run id, or a local
    id for a run outside Prefect. Use as a context manager: the heartbeat renews
    every lease held until the block ends, which gives back whatever is still held.
    """

    def __init__(self, store: Store, holder: str, run_id: str | None, lease_seconds: float,
                 with_prefect: bool = True):
        self.store, self.holder, self.run_id = store, holder, run_id
        self.lease_seconds = lease_seconds
        # Without Prefect's limits: for holds that only runs on this store contend for
        # (a replay's turn), the store's lease is the whole guard.
        self.with_prefect = with_prefect
        self._lock = threading.Lock()
        self._held: set[str] = set()
        # Each Prefect lease and the profiles of it not yet given back: one lease may
        # span chunks (profiles taken together, worked on in several chunks), and it is
        # given back with the last of them.
        self._prefect: dict[UUID, set[str]] = {}
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def __enter__(self) -> ProfileHolds:
        # Prefect's settings (the API it talks to) live in a context variable, which a
        # new thread would not see.
        self._heartbeat = threading.Thread(
            target=contextvars.copy_context().run, args=(self._renew_until_stopped,),
            daemon=True,
        )
        self._heartbeat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        self.release(list(self._held))
        with self._lock:
            left, self._prefect = list(self._prefect), {}
        for lease in left:  # none should be; a lease outliving the run blocks others
            _release_prefect_lease(lease)

    def prepare(self, profiles: Sequence[str]) -> None:
        """Create the Prefect limits missing among ``profiles``: a chunk's slots are
        taken in one request, which would silently leave out a missing limit."""
        if self.with_prefect and api_configured():
            ensure_profile_limits(self.store.id, profiles)

    def take(self, profiles: Sequence[str]) -> list[str]:
        """Take every free profile among ``profiles`` without waiting; the profiles
        taken. A chunk is tried in one go; if any of it is busy, its profiles are tried
        one by one, so the free ones are not held up by the busy ones."""
        taken: list[str] = []
        for chunk in _chunks(sorted(set(profiles) - self._held), TAKE_CHUNK):
            if self._take_all(chunk):
                taken += chunk
            elif len(chunk) > 1:
                taken += [p for p in chunk if self._take_all((p,))]
        return taken

    def release(self, profiles: Sequence[str]) -> None:
        """Give back ``profiles``, and each Prefect lease once all its profiles are."""
        gone = set(profiles) & self._held
        if not gone:
            return
        with self._lock:
            self._held -= gone
            for of in self._prefect.values():
                of -= gone
            leases = [lease for lease, of in self._prefect.items() if not of]
            for lease in leases:
                del self._prefect[lease]
        for lease in leases:
            _release_prefect_lease(lease)
        with self.store.writing_all() as s:
            release_leases(s, sorted(gone), self.holder)

    def holder_of(self, profile: str) -> str:
        """Who holds a busy profile, for people: the holding flow run's name and id, a
        local run's id, or that only its Prefect slot is taken."""
        with self.store.reading_all() as s:
            holder = lease_holders(s).get(profile)
        if holder is None:
            return "an unknown holder of its Prefect slot"
        try:
            run_id = UUID(holder)
        except ValueError:
            return f"local run {holder}"
        if not api_configured():
            return f"flow run {holder}"
        try:
            from prefect.client.orchestration import get_client

            with get_client(sync_client=True) as client:
                return f"flow run '{client.read_flow_run(run_id).name}' ({holder})"
        except Exception:  # noqa: BLE001 - the id alone still says who
            return f"flow run {holder}"

    def _take_all(self, chunk: tuple[str, ...]) -> bool:
        """All of ``chunk`` (both guards) or none of it."""
        lease = None
        if self.with_prefect and api_configured():
            lease = _prefect_lease_for(self.store.id, chunk, self.run_id,
                                       _prefect_seconds(self.lease_seconds))
            if lease is None:
                return False
        now = utcnow()
        with self.store.writing_all() as s:
            dead = expired_leases(s, chunk, self.holder, now)
            taken = acquire_leases(s, list(chunk), self.holder, self.lease_seconds, now)
        if dead.keys() & set(taken):
            # Taken over, even if given back below: nobody else will see that lease.
            mark_crashed({p: h for p, h in dead.items() if p in taken})
        if len(taken) < len(chunk):
            if taken:
                with self.store.writing_all() as s:
                    release_leases(s, taken, self.holder)
            if lease is not None:
                _release_prefect_lease(lease)
            return False
        with self._lock:
            self._held.update(chunk)
            if lease is not None:
                self._prefect[lease] = set(chunk)
        return True

    def _renew_until_stopped(self) -> None:
        """Renew every lease held while the run lives: a killed run stops renewing, and
        its profiles come free within a lease."""
        while not self._stop.wait(self.lease_seconds / 3):
            with self._lock:
                held, leases = sorted(self._held), list(self._prefect)
            try:
                if held:
                    # Renew only: a profile given back since the copy above must not
                    # be taken again by its own heartbeat.
                    with self.store.writing_all() as s:
                        renewed = set(renew_leases(s, held, self.holder,
                                                   self.lease_seconds, utcnow()))
                    with self._lock:
                        lost = (set(held) - renewed) & self._held
                    if lost:
                        log.error("the store lease of %d profile(s) expired and was not "
                                  "renewed (%s): another run may take them", len(lost),
                                  ", ".join(sorted(lost)[:5]))
                if leases:
                    from prefect.client.orchestration import get_client

                    with get_client(sync_client=True) as client:
                        for lease in leases:
                            client.renew_concurrency_lease(
                                lease, _prefect_seconds(self.lease_seconds))
            except Exception as exc:  # noqa: BLE001 - a missed beat is retried
                log.warning("could not renew the profile leases: %s", exc)


def _chunks(profiles: list[str], size: int) -> list[tuple[str, ...]]:
    return [tuple(profiles[i:i + size]) for i in range(0, len(profiles), size)]


def _prefect_seconds(seconds: float) -> float:
    """Prefect refuses leases shorter than a minute."""
    return max(seconds, PREFECT_MIN_LEASE_SECONDS)


def _prefect_lease_for(
    store_id: str, chunk: tuple[str, ...], run_id: str | None, seconds: float
) -> UUID | None:
    """Occupy the slots of a chunk's profiles in one request, without waiting; the
    lease, or None if any is busy. Straight through the client, not Prefect's
    ``concurrency()``: that emits an event per limit naming every other limit of the
    request (a hundred profiles make ten thousand related resources), which loads the
    server more than the runs do."""
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder

    names = [limit_name(store_id, p) for p in chunk]
    holder = ConcurrencyLeaseHolder(type="flow_run", id=UUID(run_id)) if run_id else None
    for _attempt in range(2):
        with get_client(sync_client=True) as client:
            try:
                answer = client.increment_concurrency_slots_with_lease(
                    names, 1, "concurrency", seconds, holder=holder).json()
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code == 423:  # some profile is busy
                    return None
                raise
            lease = UUID(answer["lease_id"])
            if len(answer.get("limits", [])) == len(names):
                return lease
            # A limit is missing (deleted since the run made them): make it, try again.
            client.release_concurrency_slots_with_lease(lease)
        ensure_profile_limits(store_id, chunk)
    raise HoldUnavailableError(
        f"Prefect has no concurrency limit for some of {len(chunk)} profile(s) even after "
        f"creating them ({limit_name(store_id, chunk[0])}...)")


def mark_crashed(dead: Mapping[str, str]) -> None:
    """Set Crashed the flow runs that let their profiles' leases (``dead``: profile ->
    holder) expire and are still Running. Their process is gone (or hung past a whole
    lease): without a worker or ``reverie serve``'s automations to notice, as for a
    command killed in a terminal, nothing else would ever end them."""
    by_holder: dict[str, list[str]] = {}
    for profile, holder in sorted(dead.items()):
        by_holder.setdefault(holder, []).append(profile)
    runs = {}
    for holder, profiles in by_holder.items():
        try:
            runs[UUID(holder)] = profiles
        except ValueError:  # a run outside Prefect: no state to set
            continue
    # Only from a run Prefect records (the holder's API is the one it talks to): a hold
    # taken outside any run must not start a temporary Prefect server for this.
    if not runs or not (api_configured() or flow_run_id() is not None):
        return
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    for run_id, profiles in runs.items():
        named = ", ".join(profiles[:5]) + (" ..." if len(profiles) > 5 else "")
        try:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(run_id).state
                if state is None or state.type != StateType.RUNNING:
                    continue
                client.set_flow_run_state(run_id, Crashed(message=(
                    f"its process is gone: it stopped renewing its hold on profile(s) "
                    f"{named}, which another run then took")), force=True)
        except Exception as exc:  # noqa: BLE001 - it stays as it is; this run goes on
            # (a run another Prefect API recorded is not found on this one)
            log.warning("could not mark flow run %s Crashed: %s", run_id, exc)
            continue
        run_logger().warning("flow run %s held profile(s) %s until its lease expired: "
                             "its process is gone, and it is now marked Crashed",
                             run_id, named)


def _release_prefect_lease(lease: UUID) -> None:
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            client.release_concurrency_slots_with_lease(lease)
    except Exception as exc:  # noqa: BLE001 - the lease expires on its own
        log.warning("could not release Prefect slots (they free themselves when the "
                    "lease expires): %s", exc)


def ensure_profile_limits(store_id: str, profiles: Sequence[str]) -> None:
    """Create the Prefect concurrency limits (one slot each) missing among
    ``profiles``': one read of the existing limits, page by page, then one request per
    new profile. Concurrent first runs of a new profile race to create its limit; the
    losers' refusal means it exists, which is all they need."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists

    wanted = {limit_name(store_id, p) for p in profiles}
    existing: set[str] = set()
    with get_client(sync_client=True) as client:
        read = 0
        while True:
            page = client.read_global_concurrency_limits(limit=LIMITS_PAGE, offset=read)
            read += len(page)
            existing.update(limit.name for limit in page)
            if len(page) < LIMITS_PAGE:
                break
        for name in sorted(wanted - existing):
            try:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=1))
            except ObjectAlreadyExists:
                pass
