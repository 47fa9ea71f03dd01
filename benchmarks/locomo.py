"""``reverie bench``: measure what consolidation does to a store.

``bench locomo PATH`` asks whether consolidation loses facts. It loads a
conversational memory set in LoCoMo's format (each conversation one profile, each
observation a memory of its speaker created at its session's date) into a scratch
store, and for every question of categories 1 to 4 checks whether the answer is still
found, before and after consolidation (decay, then full consolidation, at the last
session's date plus an offset): every word of the normalised answer must appear in the
best-ranked hot memories that fit a context budget (content plus date; 2,000
characters, and half of it), ranked by recall (``engines.ranking``: a summary by its
originals, and shown by the members that matched, each whole and dated, as ``reverie
recall`` shows it). A budget, not a top-k: what recall shows takes its room. Recall
is reported per LoCoMo category, and once more by deep recall (cold tier included):
an answer deep recall found before consolidation and not after is counted as lost.

It also reads what each summary left in the hot tier says of the originals it stands
for (``benchmarks.fidelity``): the share of members kept whole and of their numbers,
names and dates kept, per operation (merge, compression, cold note).
"""

from __future__ import annotations

import json
import re
import string
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

from reverie.benchmarks.fidelity import Tally, combined, fidelity
from reverie.engines.embedding import embedder_for
from reverie.engines.ranking import Candidates, Passage, dated, passages
from reverie.models.config import ConsolidationConfig
from reverie.models.errors import InputError
from reverie.models.ingest import ingest
from reverie.models.records import MemoryView
from reverie.models.settings import using_database
from reverie.models.store import Store
from reverie.models.tables import SUMMARY_ORIGINS, Origin, Tier
from reverie.recall.search import candidates_for
from reverie.runner.event_delivery import deliver, wanted
from reverie.runner.progress import Bar

ANSWERED_CATEGORIES = (1, 2, 3, 4)
DEFAULT_BUDGET = 2000
# Memories ranked per question: far more than any budget can hold.
RANKED = 500
_ARTICLES = {"a", "an", "the"}
_PUNCTUATION = str.maketrans({c: " " for c in string.punctuation})
_SESSION_DATE = re.compile(r"(\d{1,2}:\d{2}\s*[ap]m)\s+on\s+(\d{1,2}\s+\w+,?\s+\d{4})", re.I)


def words(text: object) -> set[str]:
    """Lower-case words without punctuation or articles (LoCoMo's normalisation)."""
    return {w for w in str(text).lower().translate(_PUNCTUATION).split() if w not in _ARTICLES}


def session_date(text: str) -> datetime:
    """'1:56 pm on 8 May, 2023' as a naive UTC datetime."""
    match = _SESSION_DATE.search(text)
    if not match:
        raise InputError(f"not a LoCoMo session date: {text!r}")
    day = match.group(2).replace(",", "")
    return datetime.strptime(f"{day} {match.group(1).replace(' ', '')}", "%d %B %Y %I:%M%p")


def context_line(memory: MemoryView) -> str:
    """How a memory enters the context: its words and its date."""
    return dated(memory)


def shown(candidates: Candidates[MemoryView], found: Sequence[Passage]) -> list[MemoryView]:
    """What recall shows for one query's passages, best first, each once: a summary's
    matched member (an original, whole, at its own date), else the memory itself."""
    out: list[MemoryView] = []
    seen: set[str] = set()
    for row, key, _ in found:
        m = (candidates.key_memories[key] if key >= 0 and candidates.shows_members(row)
             else candidates.memories[row])
        if m.id not in seen:
            seen.add(m.id)
            out.append(m)
    return out


@dataclass
class Question:
    text: str
    answer: str
    category: int


@dataclass
class Conversation:
    profile: str
    memories: list[dict[str, Any]]
    questions: list[Question]
    last_session: datetime


def load_locomo(path: Path) -> list[Conversation]:
    """The conversations of a LoCoMo file, as memories and answerable questions."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read LoCoMo data from {path}: {exc}") from None
    out: list[Conversation] = []
    for n, sample in enumerate(data):
        profile = str(sample.get("sample_id") or f"conversation-{n + 1}")
        conversation = sample["conversation"]
        dates = {
            key.removesuffix("_date_time"): session_date(value)
            for key, value in conversation.items() if key.endswith("_date_time")
        }
        records: list[dict[str, Any]] = []
        for key, by_speaker in sample["observation"].items():
            session = key.removesuffix("_observation")
            for speaker, facts in by_speaker.items():
                for i, (fact, dia) in enumerate(facts):
                    records.append({
                        "id": f"{session}-{speaker}-{i}", "content": fact, "kind": "episodic",
                        "entity": speaker, "session_id": session,
                        "created_at": dates[session].isoformat(),
                        "metadata": {"dialogue": dia if isinstance(dia, list) else [dia]},
                    })
        questions = [
            Question(q["question"], str(q["answer"]), int(q["category"]))
            for q in sample["qa"]
            if int(q.get("category", 0)) in ANSWERED_CATEGORIES and "answer" in q
        ]
        out.append(Conversation(profile, records, questions, max(dates.values())))
    return out


def select_conversations(
    conversations: list[Conversation], only: Sequence[str] | None
) -> list[Conversation]:
    """The conversations named in ``only`` (all when None), in the file's order; a name
    the file does not hold is an error that lists the ones it does."""
    if only is None:
        return conversations
    held = [c.profile for c in conversations]
    missing = [name for name in only if name not in held]
    if missing:
        raise InputError(f"no conversation {', '.join(missing)} in the file "
                         f"(it holds {', '.join(held)})")
    return [c for c in conversations if c.profile in set(only)]


def answered(question: Question, context: str) -> bool:
    wanted = words(question.answer)
    return bool(wanted) and wanted <= words(context)


def budgeted_context(ranked: Sequence[MemoryView], budget: int) -> str:
    """The best-ranked memories that fit in ``budget`` characters, in rank order: one too
    long for the room left is passed over for the next that fits."""
    lines: list[str] = []
    used = 0
    for memory in ranked:
        line = context_line(memory)
        cost = len(line) + (1 if lines else 0)
        if used + cost <= budget:
            used += cost
            lines.append(line)
    return "\n".join(lines)


class Category(StrEnum):
    """LoCoMo's question categories, by the number its files give them."""

    MULTI_HOP = "multi-hop"
    TEMPORAL = "temporal"
    OPEN_DOMAIN = "open-domain"
    SINGLE_HOP = "single-hop"


CATEGORIES = {1: Category.MULTI_HOP, 2: Category.TEMPORAL, 3: Category.OPEN_DOMAIN,
              4: Category.SINGLE_HOP}


@dataclass
class Snapshot:
    """One side of the bench: the hot tier's size, and per question whether its answer
    was found within each budget (hot tier) and within the first budget by deep recall
    (cold tier included)."""

    hot: int
    chars: int
    categories: list[str]
    found: dict[int, list[bool]]
    deep: list[bool]

    @property
    def asked(self) -> int:
        return len(self.categories)

    def recall(self, budget: int, category: str | None = None) -> float:
        hits = [f for f, c in zip(self.found[budget], self.categories, strict=True)
                if category is None or c == category]
        return round(sum(hits) / len(hits), 4) if hits else 0.0


def measure(store: Store, profile: str, questions: Sequence[Question],
            budgets: Sequence[int]) -> Snapshot:
    """Hot-tier size and, per question, whether its answer fits in each budgeted context
    (hot tier) and in the first budget's context of deep recall."""
    hot = candidates_for(store, profile, deep=False)
    chars = sum(len(m.content) for m in hot.memories)
    categories: list[str] = [CATEGORIES[q.category] for q in questions]
    if not questions:
        return Snapshot(len(hot.memories), chars, categories, {b: [] for b in budgets}, [])
    query_vectors = embedder_for(store.settings).encode([q.text for q in questions])

    def found_in(candidates: Candidates, budget: int) -> list[bool]:
        ranked = passages(candidates, query_vectors, min(len(candidates.memories), RANKED))
        return [
            answered(q, budgeted_context(shown(candidates, found), budget))
            for q, found in zip(questions, ranked, strict=True)
        ]

    deep = found_in(candidates_for(store, profile, deep=True), budgets[0])
    return Snapshot(len(hot.memories), chars, categories,
                    {b: found_in(hot, b) for b in budgets}, deep)


@dataclass
class ConversationResult:
    profile: str
    as_of: str
    questions: int
    before: Snapshot
    after: Snapshot
    fidelity: dict[str, Tally] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        """Answers deep recall found before consolidation and not after."""
        return sum(b and not a for b, a in zip(self.before.deep, self.after.deep, strict=True))


@dataclass
class LocomoResult:
    budget: int
    as_of_offset_days: float
    summarizer: str
    conversations: list[ConversationResult] = field(default_factory=list)

    @property
    def budgets(self) -> tuple[int, ...]:
        return budgets_for(self.budget)

    def recall(self, side: str, budget: int, category: str | None = None) -> float:
        hits = [
            f for c in self.conversations
            for f, cat in zip(getattr(c, side).found[budget], getattr(c, side).categories,
                              strict=True)
            if category is None or cat == category
        ]
        return round(sum(hits) / len(hits), 4) if hits else 0.0

    def deep_recall(self, side: str) -> float:
        hits = [f for c in self.conversations for f in getattr(c, side).deep]
        return round(sum(hits) / len(hits), 4) if hits else 0.0

    def fidelity(self) -> dict[str, Tally]:
        """Members kept whole and facts kept, per operation, over every conversation."""
        found = combined(c.fidelity for c in self.conversations)
        return {op: found[op] for op in OPERATIONS.values() if op in found}

    def totals(self) -> dict[str, Any]:
        def total(side: str, attr: str) -> int:
            return sum(getattr(getattr(c, side), attr) for c in self.conversations)

        out: dict[str, Any] = {
            "hot_before": total("before", "hot"),
            "hot_after": total("after", "hot"),
            "chars_before": total("before", "chars"),
            "chars_after": total("after", "chars"),
            "recall_before": self.recall("before", self.budget),
            "recall_after": self.recall("after", self.budget),
        }
        for budget in self.budgets[1:]:
            out[f"recall_{budget}_before"] = self.recall("before", budget)
            out[f"recall_{budget}_after"] = self.recall("after", budget)
        out |= {
            "deep_recall_before": self.deep_recall("before"),
            "deep_recall_after": self.deep_recall("after"),
            "lost": sum(c.lost for c in self.conversations),
            "questions": total("before", "asked"),
            "fidelity": {op: t.as_json() for op, t in self.fidelity().items()},
            "members_unsaid": sum(t.members - t.whole for t in self.fidelity().values()),
            "categories": {
                str(cat): {
                    "questions": sum(c.before.categories.count(cat) for c in self.conversations),
                    **{f"recall_{b}_{side}": self.recall(side, b, cat)
                       for b in self.budgets for side in ("before", "after")},
                }
                for cat in Category
            },
        }
        return out

    def as_json(self) -> dict[str, Any]:
        def side(s: Snapshot) -> dict[str, Any]:
            return {"hot": s.hot, "chars": s.chars, "asked": s.asked,
                    **{f"recall_{b}": s.recall(b) for b in self.budgets},
                    "deep_found": sum(s.deep)}

        return {
            **self.totals(),
            "budget": self.budget,
            "as_of_offset_days": self.as_of_offset_days,
            "summarizer": self.summarizer,
            "conversations": [
                {"profile": c.profile, "as_of": c.as_of, "questions": c.questions,
                 "before": side(c.before), "after": side(c.after), "lost": c.lost,
                 "fidelity": {op: t.as_json() for op, t in c.fidelity.items()}}
                for c in self.conversations
            ],
        }


def budgets_for(budget: int) -> tuple[int, ...]:
    """The budget asked for, then half of it: a summary that fits 2,000 characters of
    context but crowds 1,000 is not yet good enough."""
    return (budget, budget // 2) if budget >= 2 else (budget,)


def bench_locomo(
    path: Path,
    offset_days: float = 90.0,
    budget: int = DEFAULT_BUDGET,
    config: ConsolidationConfig | None = None,
    only: Sequence[str] | None = None,
) -> LocomoResult:
    """Load, measure, consolidate (decay, then full consolidation), measure again;
    ``only``: these conversations (by sample id), e.g. one fold's tuning pair."""
    from reverie.engines.wording import summarizer_for
    from reverie.models.db import dispose

    conversations = select_conversations(load_locomo(path), only)
    config = config or ConsolidationConfig()
    result = LocomoResult(budget, offset_days, summarizer_for(config.summarizer).mode)
    with tempfile.TemporaryDirectory(prefix="reverie-locomo-") as folder:
        url = f"sqlite:///{Path(folder) / 'locomo.db'}"
        store = Store(url)
        store.create()  # a scratch store of the bench's own
        try:
            # Conversations are counted, never named: their profiles are people's names.
            with using_database(url), Bar(len(conversations), "bench locomo",
                                          unit="conversation") as bar:
                for conv in conversations:
                    result.conversations.append(
                        _consolidate_and_measure(store, conv, offset_days, budget, config)
                    )
                    bar.update()
        finally:
            dispose(url)
    return result


def _consolidate_and_measure(
    store: Store, conv: Conversation, offset_days: float, budget: int, config: ConsolidationConfig
) -> ConversationResult:
    from reverie.flows.decay import decay
    from reverie.flows.full_consolidation import full_consolidation

    embedder = embedder_for(store.settings)
    report = ingest(store, conv.memories, embedder,
                    profile=conv.profile, queue_events=wanted())
    if report.queued_events:
        deliver(store.url)
    if report.errors:
        raise InputError(f"{conv.profile}: {report.errors[0]}")
    budgets = budgets_for(budget)
    before = measure(store, conv.profile, conv.questions, budgets)
    as_of = conv.last_session + timedelta(days=offset_days)
    decay(profile=conv.profile, as_of=as_of, config=config)
    full_consolidation(profile=conv.profile, as_of=as_of, config=config)
    after = measure(store, conv.profile, conv.questions, budgets)
    return ConversationResult(conv.profile, as_of.isoformat(), len(conv.questions), before, after,
                              summary_fidelity(store, conv.profile))


# The operations whose summaries replace their members in the hot tier, as the bench
# names them.
OPERATIONS = {Origin.DEDUP_SUMMARY.value: "merge", Origin.COMPRESSED.value: "compression",
              Origin.COLD_LEARNING.value: "cold note"}


def summaries_with_members(
    memories: Sequence[MemoryView],
) -> list[tuple[MemoryView, list[MemoryView]]]:
    """Each live summary among ``memories`` (every tier) with the originals it stands
    for: the memories superseded by it, or by a summary it absorbed, that are not
    summaries themselves. Originals oldest first."""
    by_id = {m.id: m for m in memories}

    def stands_for(m: MemoryView) -> str | None:
        seen: set[str] = set()
        while m.superseded_by and m.superseded_by in by_id and m.id not in seen:
            seen.add(m.id)
            m = by_id[m.superseded_by]
        return m.id if m.is_live else None

    members: dict[str, list[MemoryView]] = {}
    for m in memories:
        if m.origin not in SUMMARY_ORIGINS and m.superseded_by:
            top = stands_for(m)
            if top is not None:
                members.setdefault(top, []).append(m)
    return [
        (by_id[sid], sorted(ms, key=lambda m: (m.created_at, m.id)))
        for sid, ms in sorted(members.items())
        if by_id[sid].origin in SUMMARY_ORIGINS
    ]


def summary_fidelity(store: Store, profile: str) -> dict[str, Tally]:
    """Members kept whole and facts kept, per operation, over the profile's live
    summaries (``benchmarks.fidelity``)."""
    from reverie.models.repositories.memories import memories

    with store.reading(profile) as tx:
        everything = memories(tx, tiers=(Tier.HOT, Tier.COLD))
    return fidelity(
        (OPERATIONS[str(s.origin)], s.content, [(m.content, m.entity) for m in ms])
        for s, ms in summaries_with_members(everything)
    )


def render_fidelity(tallies: dict[str, Tally], summarizer: str) -> list[str]:
    """The measures' lines of the bench's text output."""
    lines = [f"summaries ({summarizer}): members kept whole (statement's content words in "
             "its own order), facts kept (numbers, names, dates of any member)",
             f"{'operation':<16} {'summaries':>9} {'members':>8} {'kept whole':>10} "
             f"{'facts':>6} {'kept':>6}"]
    if not tallies:
        lines.append("(no summary in the hot tier)")

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    rows = list(tallies.items())
    if len(rows) > 1:
        # A merge's share alone hides how many statements left the hot tier: a looser
        # merge can keep a larger share of far more members and drop more in all.
        rows.append(("all", _all(tallies)))
    for op, t in rows:
        lines.append(f"{op:<16} {t.summaries:>9} {t.members:>8} {share(t.whole_share):>10} "
                     f"{t.facts:>6} {share(t.facts_share):>6}")
    if tallies:
        t = _all(tallies)
        lines.append(f"members a summary does not say whole: {t.members - t.whole} of {t.members}")
    return lines


def _all(tallies: dict[str, Tally]) -> Tally:
    """Both measures over every summary, whatever its operation."""
    out = Tally()
    for t in tallies.values():
        out = out.merged(t)
    return out


def render_locomo(result: LocomoResult) -> str:
    short = result.budgets[-1]
    lines = [
        f"LoCoMo: answers found in a {result.budget}- and a {short}-character context "
        f"(summarizer {result.summarizer}, {result.as_of_offset_days:g} days after the last "
        "session); deep: cold tier included; lost: found by deep recall before, not after",
        f"{'conversation':<16} {'questions':>9} {'hot before':>10} {'after':>6} "
        f"{'chars before':>12} {'after':>7} {f'r@{result.budget} before':>14} {'after':>6} "
        f"{f'r@{short} before':>13} {'after':>6} {'deep before':>11} {'after':>6} {'lost':>5}",
    ]

    def row(name: str, questions: int, hot: tuple[int, int], chars: tuple[int, int],
            long: tuple[float, float], brief: tuple[float, float],
            deep: tuple[float, float], lost: int | str) -> str:
        return (
            f"{name:<16} {questions:>9} {hot[0]:>10} {hot[1]:>6} {chars[0]:>12} {chars[1]:>7} "
            f"{long[0]:>14.3f} {long[1]:>6.3f} {brief[0]:>13.3f} {brief[1]:>6.3f} "
            f"{deep[0]:>11.3f} {deep[1]:>6.3f} {lost:>5}"
        )

    def share(found: list[bool]) -> float:
        return sum(found) / len(found) if found else 0.0

    for c in result.conversations:
        lines.append(row(
            c.profile, c.questions, (c.before.hot, c.after.hot), (c.before.chars, c.after.chars),
            (c.before.recall(result.budget), c.after.recall(result.budget)),
            (c.before.recall(short), c.after.recall(short)),
            (share(c.before.deep), share(c.after.deep)), c.lost,
        ))
    t = result.totals()
    lines.append(row(
        "total", t["questions"], (t["hot_before"], t["hot_after"]),
        (t["chars_before"], t["chars_after"]), (t["recall_before"], t["recall_after"]),
        (result.recall("before", short), result.recall("after", short)),
        (t["deep_recall_before"], t["deep_recall_after"]), t["lost"],
    ))
    lines.append(f"{'category':<16} {'questions':>9} {f'r@{result.budget} before':>14} "
                 f"{'after':>6} {f'r@{short} before':>13} {'after':>6}")
    for cat, v in t["categories"].items():
        lines.append(
            f"{cat:<16} {v['questions']:>9} {v[f'recall_{result.budget}_before']:>14.3f} "
            f"{v[f'recall_{result.budget}_after']:>6.3f} {v[f'recall_{short}_before']:>13.3f} "
            f"{v[f'recall_{short}_after']:>6.3f}"
        )
    lines += render_fidelity(result.fidelity(), result.summarizer)
    return "\n".join(lines)
