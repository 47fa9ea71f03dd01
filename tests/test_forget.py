from datetime import timedelta

from models.config import ForgetConfig
from tasks.forget import ARCHIVE, DELETE, PROTECTED, plan_forget

from factories import AS_OF, view

ON = ForgetConfig(archive_threshold=0.2, delete_threshold=0.1)
OLD = AS_OF - timedelta(days=200)


def decide(*memories, config=ON, standing=frozenset()):
    return {d.memory.id: (d.action, d.reason) for d in plan_forget(memories, set(standing), AS_OF, config)}


def test_off_by_default() -> None:
    assert decide(view("a", relevance=0.0, created_at=OLD), config=ForgetConfig()) == {}


def test_thresholds_are_strict() -> None:
    out = decide(view("d", relevance=0.099, created_at=OLD), view("a", relevance=0.1, created_at=OLD),
                 view("k", relevance=0.2, created_at=OLD))
    assert out["d"][0] == DELETE and out["a"][0] == ARCHIVE and "k" not in out


def test_grace_period_89_vs_90_days() -> None:
    young = view("y", relevance=0.0, created_at=AS_OF - timedelta(days=89, hours=23))
    of_age = view("o", relevance=0.0, created_at=AS_OF - timedelta(days=90))
    out = decide(young, of_age)
    assert out["y"][0] == PROTECTED and "grace period" in out["y"][1]
    assert out["o"][0] == DELETE


def test_importance_at_07_is_protected() -> None:
    out = decide(view("p", relevance=0.0, created_at=OLD, importance=0.7),
                 view("q", relevance=0.0, created_at=OLD, importance=0.69))
    assert out["p"] == (PROTECTED, "importance 0.7 >= 0.7") and out["q"][0] == DELETE


def test_protected_kinds_and_flag() -> None:
    out = decide(view("d", relevance=0.0, created_at=OLD, kind="decision"),
                 view("i", relevance=0.0, created_at=OLD, kind="insight"),
                 view("f", relevance=0.0, created_at=OLD, protected=True))
    assert {k: v[0] for k, v in out.items()} == {"d": PROTECTED, "i": PROTECTED, "f": PROTECTED}
    custom = ForgetConfig(delete_threshold=0.1, protected_kinds=("episodic",))
    assert decide(view("d", relevance=0.0, created_at=OLD, kind="decision"), config=custom)["d"][0] == DELETE


def test_a_summary_standing_for_originals_is_archived_not_deleted() -> None:
    out = decide(view("s", relevance=0.0, created_at=OLD), standing={"s"})
    assert out["s"][0] == ARCHIVE and "stands for originals" in out["s"][1]


def test_unscored_cold_and_superseded_memories_are_not_considered() -> None:
    assert decide(view("a", created_at=OLD), view("b", relevance=0.0, created_at=OLD, tier="cold"),
                  view("c", relevance=0.0, created_at=OLD, superseded_by="s")) == {}
