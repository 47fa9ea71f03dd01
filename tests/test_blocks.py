from datetime import timedelta

from reverie.engines.wording import RulesSummarizer
from reverie.models.block_text import ELLIPSIS, SEPARATOR, cut_words, fit_facts
from reverie.models.config import BlocksConfig
from reverie.models.records import MemoryView
from reverie.models.tables import Lifecycle, Tier
from reverie.tasks.blocks import (
    ACTIVE_DECISIONS,
    BEHAVIORAL_PATTERNS,
    BLOCK_TYPES,
    LEARNED_PREFERENCES,
    PROJECT_CONTEXT,
    USER_PROFILE,
    block_sources,
    compiled,
    enforce_total,
    plan_blocks,
)

from factories import AS_OF, view

CONFIG = BlocksConfig()


def blocks(memories, config=CONFIG) -> dict[str, str]:
    plans, _ = plan_blocks(block_sources(memories, AS_OF, config), config)
    return {p.block_type: p.content for p in plans}


def sources(memories) -> dict[str, list[str]]:
    return {k: [m.id for m in v] for k, v in block_sources(memories, AS_OF, CONFIG).items()}


def test_each_block_takes_its_own_sources_in_its_own_order() -> None:
    day = timedelta(days=1)
    memories = [
        view("s1", kind="semantic", access_count=1),
        view("s2", kind="opinion", access_count=9, confidence=0.9),
        view("e1", kind="episodic", created_at=AS_OF - 3 * day),
        view("e2", kind="episodic", created_at=AS_OF - day),
        view("b1", kind="behavioral", confidence=0.6),
        view("b2", kind="pattern", confidence=0.8),
        view("d1", kind="decision", access_count=3),
        view("d2", kind="decision", access_count=2),
        view("p1", kind="preference", confidence=0.7),
        view("p2", kind="preference", confidence=0.69),
    ]
    assert sources(memories) == {
        USER_PROFILE: ["s2", "s1"],
        PROJECT_CONTEXT: ["e2", "e1"],
        BEHAVIORAL_PATTERNS: ["b2", "b1"],
        ACTIVE_DECISIONS: ["d1"],
        LEARNED_PREFERENCES: ["s2", "p1"],
    }


def test_a_summary_of_events_ranks_by_its_newest_event_not_the_day_it_was_written() -> None:
    """A compression of last year's jobs, written today, is not this week's news: it
    ranks by its newest member's day (``members_until``), and this week's events come
    first in project_context."""
    from reverie.models.tables import Origin

    day = timedelta(days=1)
    summary = view("jobs", kind="episodic", origin=Origin.COMPRESSED, created_at=AS_OF,
                   meta={"members_from": (AS_OF - 400 * day).isoformat(),
                         "members_until": (AS_OF - 300 * day).isoformat()})
    recent = [view(f"e{i}", kind="episodic", created_at=AS_OF - i * day) for i in range(1, 6)]
    assert sources([summary, *recent])[PROJECT_CONTEXT] == ["e1", "e2", "e3", "e4", "e5"]
    older = view("e0", kind="episodic", created_at=AS_OF - 350 * day)
    assert sources([summary, older])[PROJECT_CONTEXT] == ["jobs", "e0"]
    # A day it cannot read leaves the day it was written.
    unreadable = view("x", kind="episodic", created_at=AS_OF, meta={"members_until": "soon"})
    assert sources([unreadable, *recent])[PROJECT_CONTEXT][0] == "x"


def test_ranked_blocks_take_the_top_five() -> None:
    memories = [view(f"s{i}", kind="semantic", access_count=i) for i in range(8)]
    assert sources(memories)[USER_PROFILE] == ["s7", "s6", "s5", "s4", "s3"]


def test_the_same_words_stored_twice_are_one_fact_in_a_block() -> None:
    """An agent trial's project_context said each line twice: its agent loop, run twice,
    stored the same sentences again, and no dedup had run since."""
    memories = [view("a1", kind="episodic", content="I moved to Lyon last month"),
                view("a2", kind="episodic", content="I  moved to lyon last month"),
                view("b", kind="episodic", content="My sister Ines visits in May")]
    assert sorted(sources(memories)[PROJECT_CONTEXT]) in (["a1", "b"], ["a2", "b"])
    more = [view(f"s{i}", kind="semantic", content=f"fact {i % 2}") for i in range(8)]
    assert len(sources(more)[USER_PROFILE]) == 2  # two facts, not five lines


def test_cold_archived_and_expired_memories_are_left_out() -> None:
    memories = [
        view("cold", kind="semantic", tier=Tier.COLD, superseded_by="x"),
        view("archived", kind="semantic", lifecycle=Lifecycle.ARCHIVED),
        view("expired", kind="semantic", valid_until=AS_OF),
        view("future", kind="semantic", valid_from=AS_OF + timedelta(hours=1)),
        view("live", kind="semantic", valid_until=AS_OF + timedelta(hours=1)),
    ]
    assert sources(memories)[USER_PROFILE] == ["live"]


def test_a_block_of_exactly_the_limit_is_kept_whole() -> None:
    a, b = "a" * 245, "b" * (500 - 245 - len(SEPARATOR))
    assert fit_facts([a, b], 500) == [a, b]
    assert len(SEPARATOR.join(fit_facts([a, b], 500))) == 500


def test_one_character_over_drops_the_last_fact_whole() -> None:
    a, b = "a" * 245, "b" * (501 - 245 - len(SEPARATOR))
    assert fit_facts([a, b], 500) == [a]


def test_a_single_fact_longer_than_the_block_is_cut_at_a_word() -> None:
    fact = " ".join(["word"] * 200)
    (cut,) = fit_facts([fact], 500)
    assert len(cut) <= 500 and cut.endswith(ELLIPSIS)
    assert cut[: -len(ELLIPSIS)].split(" ")[-1] == "word"
    assert cut_words("x" * 10, 10) == "x" * 10


def test_five_full_blocks_are_trimmed_to_the_total() -> None:
    memories = []
    for kind, block in [("semantic", 0), ("episodic", 1), ("behavioral", 2), ("decision", 3),
                        ("preference", 4)]:
        for i in range(5):
            memories.append(view(f"{block}-{i}", kind=kind, content=f"{kind} fact {i} " + "z" * 85,
                                 access_count=5, confidence=0.9))
    out = blocks(memories)
    assert all(len(text) <= 500 for text in out.values())
    assert sum(len(text) for text in out.values()) <= 2000
    # Trimming happens at fact boundaries: every fact left is whole.
    for text in out.values():
        assert all(fact.endswith("z" * 85) for fact in text.split(SEPARATOR))


def test_a_total_of_exactly_the_limit_is_kept() -> None:
    facts = {name: ["x" * 400] for name in BLOCK_TYPES}
    assert enforce_total(facts, 2000) == facts
    over = enforce_total({**facts, USER_PROFILE: ["x" * 401]}, 2000)
    assert sum(len(f[0]) for f in over.values()) <= 2000


def test_trimming_takes_from_the_longest_block_first() -> None:
    facts = {USER_PROFILE: ["a" * 100, "b" * 100], PROJECT_CONTEXT: ["c" * 50]}
    assert enforce_total(facts, 200) == {USER_PROFILE: ["a" * 100], PROJECT_CONTEXT: ["c" * 50]}


def test_both_limits_are_settings() -> None:
    memories = [view(f"s{i}", kind="semantic", content="fact " + "y" * 40) for i in range(5)]
    out = blocks(memories, BlocksConfig(block_char_limit=100, core_memory_char_limit=60))
    assert len(out[USER_PROFILE]) <= 60


def test_facts_are_one_line_each_and_empty_blocks_are_empty() -> None:
    out = blocks([view("s", kind="semantic", content="two\nlines")])
    assert out[USER_PROFILE] == "two lines"
    assert out[PROJECT_CONTEXT] == ""


def test_source_ids_list_only_the_facts_that_fit() -> None:
    memories = [view(f"s{i}", kind="semantic", content=str(i) * 200, access_count=9 - i)
                for i in range(3)]
    plans, _ = plan_blocks(block_sources(memories, AS_OF, CONFIG), CONFIG)
    profile = next(p for p in plans if p.block_type == USER_PROFILE)
    assert profile.source_ids == ("s0", "s1")


class _Failing(RulesSummarizer):
    mode = "llm"

    def compile_block(self, block_type, facts, char_limit):  # type: ignore[no-untyped-def]
        self.failures.append(f"block {block_type}: timeout")
        return None


def test_a_summarizer_that_fails_falls_back_to_rules_and_says_so() -> None:
    plans, notes = compiled([view("s", kind="semantic")], AS_OF, CONFIG, _Failing())
    assert next(p for p in plans if p.block_type == USER_PROFILE).mode == "rules"
    assert notes[0] == "llm: 1 wording(s) fell back to rules (block user_profile: timeout)"


def test_an_empty_block_says_which_rule_no_memory_meets_yet() -> None:
    # Two uses of a decision are one short of the rule; a third fills the block.
    decision = view("d", kind="decision", content="Decided to ship", access_count=2)
    _, notes = compiled([decision], AS_OF, CONFIG, RulesSummarizer())
    assert ("active_decisions is empty: no memory meets its rule yet (decisions used at "
            "least 3 times (an access is counted by recall --track or record_access))") in notes
    assert any(n.startswith("user_profile is empty") for n in notes)  # no semantic fact
    used = view("d", kind="decision", content="Decided to ship", access_count=3)
    _, notes = compiled([used], AS_OF, CONFIG, RulesSummarizer())
    assert not any(n.startswith("active_decisions") for n in notes)


def test_views_are_plain_records() -> None:
    assert isinstance(view("x"), MemoryView)


def test_importance_breaks_ties_the_seeds_order_leaves_open() -> None:
    """Right after an import no fact has been used: the most important are kept, not
    the newest (issue #17: 'Alice is allergic to peanuts', importance 0.9, was left out)."""
    chatter = [view(f"s{i}", kind="semantic", importance=0.3,
                    created_at=AS_OF - timedelta(days=i)) for i in range(5)]
    allergy = view("allergy", kind="semantic", importance=0.9, created_at=AS_OF - timedelta(days=30))
    assert "allergy" in sources([*chatter, allergy])[USER_PROFILE]
    # Use still comes first, as SuperLocalMemory orders it.
    used = [view(f"u{i}", kind="semantic", importance=0.1, access_count=2) for i in range(5)]
    assert "allergy" not in sources([*used, allergy])[USER_PROFILE]


def test_each_block_states_its_rule() -> None:
    from reverie.models.block_text import block_rules

    rules = block_rules(BlocksConfig(decision_min_access=4, facts_per_block=3))
    assert set(rules) == set(BLOCK_TYPES)
    assert rules[ACTIVE_DECISIONS].startswith("decisions used at least 4 times")
    assert rules[USER_PROFILE].startswith("the 3 semantic or opinion facts")
