"""``reverie bench``: measure what consolidation does to a store.

``bench locomo PATH`` asks whether consolidation loses facts. It loads a
conversational memory set in LoCoMo's format (each conversation one profile, each
observation a memory of its speaker created at its session's date) into a scratch
store, and for every question of categories 1 to 4 checks whether the answer is still
found, before and after consolidation (decay, then full consolidation, at the last
session's date plus an offset): every word of the normalised answer must appear in the
best-ranked hot memories that fit a context budget (content plus date; 2,000
characters), ranked by similarity to the question. A budget, not a top-k: a summary
that concatenates five memories takes five memories' room.
"""

from __future__ import annotations

import json
import re
import string
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from reverie.engines.similarity import top_k
from reverie.flows.event_delivery import deliver, wanted
from reverie.flows.progress import Bar
from reverie.models.config import ConsolidationConfig
from reverie.models.embeddings import get_embedder
from reverie.models.errors import InputError
from reverie.models.ingest import ingest
from reverie.models.records import MemoryView
from reverie.models.repositories.memories import snapshot
from reverie.models.settings import using_database
from reverie.models.store import Store
from reverie.models.tables import Tier

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
    d = memory.created_at
    return f"{memory.content} ({d.day} {d:%B %Y})"


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


@dataclass
class Snapshot:
    hot: int
    chars: int
    found: int
    asked: int

    @property
    def recall(self) -> float:
        return round(self.found / self.asked, 4) if self.asked else 0.0


def measure(store: Store, profile: str, questions: Sequence[Question], budget: int) -> Snapshot:
    """Hot-tier size and the share of questions whose answer fits in the budgeted context."""
    with store.reading(profile) as tx:
        memories, vectors = snapshot(tx, (Tier.HOT,))
    chars = sum(len(m.content) for m in memories)
    if not questions or not memories:
        return Snapshot(len(memories), chars, 0, len(questions))
    embedder = get_embedder(store.settings.embedding_model_path,
                            store.settings.embedding_batch_size)
    query_vectors = embedder.encode([q.text for q in questions])
    _, ranks = top_k(vectors, query_vectors, min(len(memories), RANKED))
    found = sum(
        answered(q, budgeted_context([memories[i] for i in row if i >= 0], budget))
        for q, row in zip(questions, ranks, strict=True)
    )
    return Snapshot(len(memories), chars, found, len(questions))


@dataclass
class ConversationResult:
    profile: str
    as_of: str
    questions: int
    before: Snapshot
    after: Snapshot


@dataclass
class LocomoResult:
    budget: int
    as_of_offset_days: float
    summarizer: str
    conversations: list[ConversationResult] = field(default_factory=list)

    def totals(self) -> dict[str, Any]:
        def total(side: str, attr: str) -> int:
            return sum(getattr(getattr(c, side), attr) for c in self.conversations)

        asked = total("before", "asked")
        return {
            "hot_before": total("before", "hot"),
            "hot_after": total("after", "hot"),
            "chars_before": total("before", "chars"),
            "chars_after": total("after", "chars"),
            "recall_before": round(total("before", "found") / asked, 4) if asked else 0.0,
            "recall_after": round(total("after", "found") / asked, 4) if asked else 0.0,
            "questions": asked,
        }

    def as_json(self) -> dict[str, Any]:
        return {
            **self.totals(),
            "budget": self.budget,
            "as_of_offset_days": self.as_of_offset_days,
            "summarizer": self.summarizer,
            "conversations": [
                {"profile": c.profile, "as_of": c.as_of, "questions": c.questions,
                 "before": {**asdict(c.before), "recall": c.before.recall},
                 "after": {**asdict(c.after), "recall": c.after.recall}}
                for c in self.conversations
            ],
        }


def bench_locomo(
    path: Path,
    offset_days: float = 90.0,
    budget: int = DEFAULT_BUDGET,
    config: ConsolidationConfig | None = None,
) -> LocomoResult:
    """Load, measure, consolidate (decay, then full consolidation), measure again."""
    from reverie.models.db import dispose
    from reverie.tasks.summarize import summarizer_for

    conversations = load_locomo(path)
    config = config or ConsolidationConfig()
    result = LocomoResult(budget, offset_days, summarizer_for(config.summarizer).mode)
    with tempfile.TemporaryDirectory(prefix="reverie-locomo-") as folder:
        url = f"sqlite:///{Path(folder) / 'locomo.db'}"
        store = Store(url)
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

    embedder = get_embedder(store.settings.embedding_model_path,
                            store.settings.embedding_batch_size)
    report = ingest(store, conv.memories, embedder,
                    profile=conv.profile, queue_events=wanted())
    if report.queued_events:
        deliver(store.url)
    if report.errors:
        raise InputError(f"{conv.profile}: {report.errors[0]}")
    before = measure(store, conv.profile, conv.questions, budget)
    as_of = conv.last_session + timedelta(days=offset_days)
    decay(profile=conv.profile, as_of=as_of, config=config)
    full_consolidation(profile=conv.profile, as_of=as_of, config=config)
    after = measure(store, conv.profile, conv.questions, budget)
    return ConversationResult(conv.profile, as_of.isoformat(), len(conv.questions), before, after)


def render_locomo(result: LocomoResult) -> str:
    lines = [
        f"LoCoMo: answers found in a {result.budget}-character context (summarizer "
        f"{result.summarizer}, {result.as_of_offset_days:g} days after the last session)",
        f"{'conversation':<16} {'questions':>9} {'hot before':>10} {'after':>6} "
        f"{'chars before':>12} {'after':>7} {'recall before':>13} {'after':>6}",
    ]
    for c in result.conversations:
        lines.append(
            f"{c.profile:<16} {c.questions:>9} {c.before.hot:>10} {c.after.hot:>6} "
            f"{c.before.chars:>12} {c.after.chars:>7} {c.before.recall:>13.3f} "
            f"{c.after.recall:>6.3f}"
        )
    t = result.totals()
    lines.append(
        f"{'total':<16} {t['questions']:>9} {t['hot_before']:>10} {t['hot_after']:>6} "
        f"{t['chars_before']:>12} {t['chars_after']:>7} {t['recall_before']:>13.3f} "
        f"{t['recall_after']:>6.3f}"
    )
    return "\n".join(lines)
