from datetime import timedelta

from reverie.models.config import PromotionConfig
from reverie.models.tables import Lifecycle, Tier
from reverie.tasks.promote import plan_promotions

from factories import AS_OF, view

CONFIG = PromotionConfig()


def lifecycle_changes(*memories):
    return {m.id: lc for m, lc, _ in plan_promotions(memories, AS_OF, CONFIG)}


def test_access_threshold() -> None:
    assert lifecycle_changes(view("a", access_count=2, confidence=0.9)) == {}
    assert lifecycle_changes(view("a", access_count=3, confidence=0.9)) == {"a": Lifecycle.PROMOTED}


def test_trust_threshold() -> None:
    assert lifecycle_changes(view("a", access_count=5, confidence=0.49)) == {}
    assert lifecycle_changes(view("a", access_count=5, confidence=0.5)) == {"a": Lifecycle.PROMOTED}


def test_expired_or_not_yet_valid_memories_are_not_promoted() -> None:
    eligible = {"access_count": 5, "confidence": 0.9}
    assert lifecycle_changes(view("a", valid_until=AS_OF, **eligible)) == {}
    assert lifecycle_changes(view("a", valid_until=AS_OF + timedelta(seconds=1), **eligible)) == {
        "a": Lifecycle.PROMOTED
    }
    assert lifecycle_changes(view("a", valid_from=AS_OF + timedelta(days=1), **eligible)) == {}


def test_promoted_memories_that_expire_return_to_active() -> None:
    m = view("a", access_count=5, confidence=0.9, lifecycle=Lifecycle.PROMOTED, valid_until=AS_OF)
    ((_, lifecycle, why),) = plan_promotions([m], AS_OF, CONFIG)
    assert (lifecycle, why) == (Lifecycle.ACTIVE, "expired")


def test_rule_is_idempotent_and_skips_cold_memories() -> None:
    assert lifecycle_changes(view("a", access_count=5, confidence=0.9, lifecycle=Lifecycle.PROMOTED)) == {}
    assert lifecycle_changes(view("a", access_count=5, confidence=0.9, tier=Tier.COLD)) == {}
