"""Cold migration and cold TTL expiry (cognitive-memory's tick), at their boundaries with
the seed's numbers: cold_migration_days 7 (its test: 3, passed at 5 days) and
cold_storage_ttl_days 180 (its test: 30, passed at 35 days)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from reverie.deployments.cli import EXIT_ERROR, EXIT_OK, main
from reverie.flows.cold_tier import cold_tier
from reverie.flows.lightweight_consolidation import lightweight_consolidation
from reverie.models.config import ColdTierConfig
from reverie.models.export import export_rows
from reverie.models.ids import content_hash
from reverie.models.repositories import blocks as blocks_repo
from reverie.models.repositories import memories as memories_repo
from reverie.models.store import Store
from reverie.models.tables import Lifecycle, Operation, Tier, Tombstone
from reverie.recall.search import recall
from reverie.tasks.cold_tier import Action, plan_expiry, plan_migration

from factories import AS_OF, get_memory, in_read, ingest_records, undo_consolidation, view

DAY = timedelta(days=1)
SEED_MIGRATION = ColdTierConfig(migrate_after_days=7)
SEED_TTL = ColdTierConfig(ttl_days=180)


def migrated(*memories, config=SEED_MIGRATION, undone=frozenset()):
    return {d.memory.id: (d.action, d.reason)
            for d in plan_migration(memories, AS_OF, config, set(undone))}


def expired(*memories, since, config=SEED_TTL, standing=frozenset(), approved=True):
    return {d.memory.id: (d.action, d.reason)
            for d in plan_expiry(memories, since, set(standing), AS_OF, config, approved)}


# --- migration ----------------------------------------------------------------------------

def test_both_are_off_by_default() -> None:
    ancient = AS_OF - 10_000 * DAY
    assert migrated(view("a", created_at=ancient), config=ColdTierConfig()) == {}
    assert expired(view("c", tier=Tier.COLD, created_at=ancient), since={"c": ancient},
                   config=ColdTierConfig()) == {}


def test_migration_at_7_days_unused_not_at_6() -> None:
    out = migrated(view("six", created_at=AS_OF - 6 * DAY),
                   view("seven", created_at=AS_OF - 7 * DAY),
                   view("eight", created_at=AS_OF - 8 * DAY))
    assert "six" not in out
    assert out["seven"] == (Action.MIGRATE, "unused for 7.0 days >= 7")
    assert out["eight"][0] == Action.MIGRATE


def test_the_seeds_own_test_numbers_3_days_passed_at_5() -> None:
    out = migrated(view("m", created_at=AS_OF - 5 * DAY), config=ColdTierConfig(migrate_after_days=3))
    assert out["m"][0] == Action.MIGRATE


def test_an_access_starts_the_count_again() -> None:
    old = AS_OF - 200 * DAY
    out = migrated(view("used", created_at=old, last_accessed_at=AS_OF - 6 * DAY, access_count=4),
                   view("once", created_at=old, last_accessed_at=AS_OF - 7 * DAY, access_count=1))
    assert "used" not in out and out["once"][0] == Action.MIGRATE


def test_protected_promoted_and_undone_memories_stay_hot() -> None:
    old = AS_OF - 400 * DAY
    out = migrated(view("flag", created_at=old, protected=True),
                   view("core", created_at=old, lifecycle=Lifecycle.PROMOTED),
                   view("undo", created_at=old),
                   view("free", created_at=old), undone={"undo"})
    assert out["flag"] == (Action.EXEMPT, "flagged protected")
    assert out["core"] == (Action.EXEMPT, "promoted")
    assert out["undo"][0] == Action.EXEMPT and "undone" in out["undo"][1]
    assert out["free"][0] == Action.MIGRATE


def test_only_live_hot_memories_are_migrated() -> None:
    old = AS_OF - 400 * DAY
    assert migrated(view("c", created_at=old, tier=Tier.COLD),
                    view("s", created_at=old, superseded_by="m-summary")) == {}


# --- expiry -------------------------------------------------------------------------------

def test_expiry_at_180_days_cold_not_at_179() -> None:
    created = AS_OF - 400 * DAY
    since = {"a": AS_OF - 179 * DAY, "b": AS_OF - 180 * DAY, "c": AS_OF - 181 * DAY}
    out = expired(*(view(k, tier=Tier.COLD, created_at=created) for k in since), since=since)
    assert "a" not in out
    assert out["b"] == (Action.EXPIRE, "cold for 180.0 days >= 180 (cold since 2025-01-02; "
                        "created 2024-05-27, last used never)")
    assert out["c"][0] == Action.EXPIRE


def test_the_seeds_own_ttl_numbers_30_days_passed_at_35() -> None:
    out = expired(view("w", tier=Tier.COLD), since={"w": AS_OF - 35 * DAY},
                  config=ColdTierConfig(ttl_days=30))
    assert out["w"][0] == Action.EXPIRE


def test_what_is_never_expired() -> None:
    long_ago = AS_OF - 1000 * DAY
    cold = dict(tier=Tier.COLD, created_at=long_ago - DAY)
    out = expired(view("flag", protected=True, **cold), view("orig", superseded_by="s", **cold),
                  view("s", **cold), view("unknown", **cold), view("hot", created_at=long_ago),
                  since={k: long_ago for k in ("flag", "orig", "s", "hot")}, standing={"s"})
    assert out["flag"] == (Action.EXEMPT, "flagged protected")
    assert out["orig"] == (Action.EXEMPT, "an original s stands for")
    assert out["s"] == (Action.EXEMPT, "it stands for originals in the cold tier")
    assert out["unknown"] == (Action.EXEMPT, "no record of when it went cold")
    assert "hot" not in out


def test_unapproved_expiry_lists_and_keeps() -> None:
    out = expired(view("c", tier=Tier.COLD), since={"c": AS_OF - 200 * DAY}, approved=False)
    assert out["c"][0] == Action.NOT_APPROVED and "not approved" in out["c"][1]


# --- through the flow, the store and the CLI ----------------------------------------------



def iso(days: float) -> str:
    return (AS_OF - timedelta(days=days)).isoformat() + "Z"


@pytest.fixture
def tiered(store: Store) -> Store:
    """Profile p: a fact unused for 10 days, one used 3 days ago, a protected old one;
    profile q: the same unused fact (it must not move when only p is run)."""
    rows = [
        {"profile": "p", "id": "stale", "content": "Ana's first car was a red Fiat",
         "created_at": iso(10)},
        {"profile": "p", "id": "fresh", "content": "Ana is learning Portuguese",
         "created_at": iso(100), "last_accessed_at": iso(3), "access_count": 2},
        {"profile": "p", "id": "pinned", "content": "Ana is allergic to penicillin",
         "created_at": iso(100), "protected": True},
        {"profile": "q", "id": "stale", "content": "Ben's first car was a blue Volvo",
         "created_at": iso(10)},
    ]
    assert not ingest_records(store, rows).errors
    return store


def rows(store: Store, profile: str = "p") -> list[dict]:
    return list(export_rows(store.url, profile))


def tiers(store: Store, profile: str) -> dict[str, str]:
    return {r["external_id"]: r["tier"] for r in export_rows(store.url, profile)
            if r["type"] == "memory"}


def state(store: Store, profile: str) -> list[dict]:
    return [r for r in export_rows(store.url, profile) if r["type"] != "consolidation"]


@pytest.mark.usefixtures("prefect_api")
def test_migration_is_found_by_deep_recall_and_by_id_and_profiles_never_mix(
    tiered: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    report = cold_tier(profile="p", as_of=AS_OF, migrate_after_days=7)
    migrate, expire = report.steps
    assert (migrate.step, expire.step) == ("migrate_cold", "expire_cold")
    assert migrate.facts["migrated"] == 1 and migrate.facts["exempt"] == 1
    assert tiers(tiered, "p") == {"stale": Tier.COLD, "fresh": Tier.HOT, "pinned": Tier.HOT}
    assert tiers(tiered, "q") == {"stale": Tier.HOT}
    assert all(h.memory.external_id != "stale" for h in recall(tiered, "p", "Ana's first car", k=3))
    deep = recall(tiered, "p", "Ana's first car", k=3, deep=True)
    assert deep[0].memory.external_id == "stale" and deep[0].memory.tier == Tier.COLD
    assert main(["get", "stale", "--profile", "p", "--json"]) == EXIT_OK
    got = json.loads(capsys.readouterr().out)
    assert got["tier"] == Tier.COLD and got["content"] == "Ana's first car was a red Fiat"
    # Every profile at once: q decides on its own memories only.
    cold_tier(profile=None, as_of=AS_OF, migrate_after_days=7)
    assert tiers(tiered, "q") == {"stale": Tier.COLD} and tiers(tiered, "p")["fresh"] == Tier.HOT


@pytest.mark.usefixtures("prefect_api")
def test_a_second_run_and_a_dry_run_change_nothing(tiered: Store) -> None:
    before = rows(tiered)
    dry = cold_tier(profile="p", as_of=AS_OF, migrate_after_days=7, dry_run=True)
    assert rows(tiered) == before
    real = cold_tier(profile="p", as_of=AS_OF, migrate_after_days=7)
    assert dry.comparable() == real.comparable() and real.changed() == 1
    after = rows(tiered)
    assert cold_tier(profile="p", as_of=AS_OF, migrate_after_days=7).changed() == 0
    assert rows(tiered) == after


@pytest.mark.usefixtures("prefect_api")
def test_undo_brings_a_migrated_memory_back_and_it_is_not_moved_again(
    tiered: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    lightweight_consolidation(profile="p", as_of=AS_OF)  # the user_profile block quotes it
    assert "red Fiat" in " ".join(b.content for b in in_read(tiered, "p", blocks_repo.blocks))
    before = state(tiered, "p")
    cold_tier(profile="p", as_of=AS_OF, migrate_after_days=7)
    assert "red Fiat" not in " ".join(b.content for b in in_read(tiered, "p", blocks_repo.blocks))
    (audit,) = [r for r in rows(tiered)
                if r["type"] == "consolidation" and r["operation"] == Operation.MIGRATE_COLD]
    assert main(["undo", audit["id"], "--profile", "p"]) == EXIT_OK
    assert "1 memories restored" in capsys.readouterr().out
    assert tiers(tiered, "p")["stale"] == Tier.HOT
    restored = [r for r in state(tiered, "p") if r["type"] == "memory"]
    assert restored == [r for r in before if r["type"] == "memory"]
    later = cold_tier(profile="p", as_of=AS_OF + 30 * DAY, migrate_after_days=7)
    # 30 days on, 'fresh' is unused for 33 days and goes; 'stale' stays, as undone.
    assert tiers(tiered, "p") == {"stale": Tier.HOT, "fresh": Tier.COLD, "pinned": Tier.HOT}
    assert any(c.action == "exempt" and "undone" in c.detail for c in later.steps[0].changes)


@pytest.mark.usefixtures("prefect_api")
def test_expiry_at_the_ttl_leaves_a_tombstone_that_get_reads(
    tiered: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    cold_tier(profile="p", as_of=AS_OF, migrate_after_days=7)
    stale_id = next(r["id"] for r in rows(tiered) if r.get("external_id") == "stale")
    # A day before the TTL: nothing; at it, unapproved: listed, kept.
    assert cold_tier(profile="p", as_of=AS_OF + 179 * DAY, ttl_days=180,
                     auto_approve_expiry=True).steps[1].facts["expired"] == 0
    unapproved = cold_tier(profile="p", as_of=AS_OF + 180 * DAY, ttl_days=180).steps[1]
    assert unapproved.facts == {"expired": 0, "exempt": 0, "not_approved": 1,
                                "blocks_recompiled": 0}
    assert tiers(tiered, "p")["stale"] == Tier.COLD
    dry = cold_tier(profile="p", as_of=AS_OF + 180 * DAY, ttl_days=180, auto_approve_expiry=True,
                    dry_run=True)
    assert dry.steps[1].facts["expired"] == 1 and tiers(tiered, "p")["stale"] == Tier.COLD
    real = cold_tier(profile="p", as_of=AS_OF + 180 * DAY, ttl_days=180, auto_approve_expiry=True)
    assert real.comparable() == dry.comparable()
    assert "stale" not in tiers(tiered, "p") and tiers(tiered, "q") == {"stale": Tier.HOT}
    assert in_read(tiered, "p", memories_repo.counts) == {Tier.HOT: 2, Tier.COLD: 0, "tombstones": 1}
    tomb = get_memory(tiered, "stale", "p")
    assert isinstance(tomb, Tombstone) and tomb.memory_id == stale_id
    assert tomb.content_hash == content_hash("Ana's first car was a red Fiat")
    assert main(["get", "stale", "--profile", "p", "--json"]) == EXIT_OK
    got = json.loads(capsys.readouterr().out)
    assert got["tombstone"] is True and got["external_id"] == "stale"
    assert "cold since 2025-07-01; created 2025-06-21, last used never" in got["reason"]
    assert "content" not in got
    (audit,) = [r for r in rows(tiered)
                if r["type"] == "consolidation" and r["operation"] == Operation.EXPIRE_COLD]
    assert audit["parameters"]["expired"][stale_id]["cold_since"] == AS_OF.isoformat()
    # Idempotent; and undoing the migration now restores nothing (it is a tombstone).
    assert cold_tier(profile="p", as_of=AS_OF + 180 * DAY, ttl_days=180,
                     auto_approve_expiry=True).changed() == 0
    migration = next(r["id"] for r in rows(tiered)
                     if r["type"] == "consolidation" and r["operation"] == Operation.MIGRATE_COLD)
    assert undo_consolidation(tiered, migration, "p").restored == []


@pytest.mark.usefixtures("prefect_api")
def test_the_cli_runs_it_and_checks_its_options(
    tiered: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    as_of = ["--profile", "p", "--as-of", AS_OF.isoformat()]
    assert main(["run", "cold-tier", *as_of, "--migrate-after-days", "0.5"]) == EXIT_ERROR
    assert main(["run", "decay", *as_of, "--ttl-days", "30"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "migrate_after_days" in err and "apply to `run cold-tier` only" in err
    assert main(["run", "cold-tier", *as_of, "--migrate-after-days", "7"]) == EXIT_OK
    assert "migrate_cold" in capsys.readouterr().out and tiers(tiered, "p")["stale"] == Tier.COLD
