"""LLM summaries against a real chat-completions server on loopback: answers are
bounded in time, retried only when that can help, cut off by a circuit breaker, and
checked (clean text, no instructions, no invented or lost facts) before they are stored."""

from __future__ import annotations

import re
import threading
import time
import unicodedata
import uuid
from datetime import datetime, timedelta

import pytest

from reverie.engines import llm as llm_module
from reverie.engines.llm import (
    COMPRESS_PROMPT,
    MERGE_PROMPT,
    LLMSummarizer,
    Rejected,
    breaker_for,
    check_answer,
    facts,
    kept_names,
)
from reverie.engines.wording import RulesSummarizer, fallback_notes, summarizer_for
from reverie.flows.full_consolidation import full_consolidation
from reverie.flows.lightweight_consolidation import lightweight_consolidation
from reverie.models import transient as transient_module
from reverie.models.config import ConsolidationConfig
from reverie.models.export import export_rows
from reverie.models.settings import get_settings
from reverie.models.store import Store
from reverie.models.tables import Origin
from reverie.runner.artifacts import markdown
from reverie.runner.report import RunReport

from factories import at_cosine, axis, ingest_records, undo_consolidation, view
from llm_server import INJECTION, VAGUE

MEMBERS = [view(f"m{i}", content=f"User went hiking at spot {i} on March {10 + i}") for i in range(5)]
FAITHFUL = "User went hiking at spot 0 on March 10 1 11 2 12 3 13 4 14"
AS_OF = datetime(2025, 7, 1)
LLM = ConsolidationConfig(summarizer="llm")
# What a loaded machine may add to a time bound before a thread gets to run again. The
# stalled servers here would take minutes, so a bound plus this still tells a deadline
# that works from one that does not (these are no speed tests).
SCHEDULING_SLACK_SECONDS = 10.0


def fell_back(report: RunReport) -> int:
    """Wordings the run's steps say fell back to the rules."""
    return sum(
        int(m.group(1))
        for s in report.steps for n in s.notes
        for m in [re.match(r"llm: (\d+) wording\(s\) fell back", n)] if m
    )


def rows(store: Store, profile: str, kind: str) -> list[dict]:
    return [r for r in export_rows(store.url, profile) if r["type"] == kind]


def worded(store: Store, profile: str) -> tuple[list[str], dict[str, str]]:
    """Modes of the profile's dedup summaries, and of its blocks by type."""
    summaries = {m["id"] for m in rows(store, profile, "memory") if m["origin"] == Origin.DEDUP_SUMMARY}
    modes = [c["parameters"]["mode"] for c in rows(store, profile, "consolidation")
             if c["summary_id"] in summaries]
    return modes, {b["block_type"]: b["mode"] for b in rows(store, profile, "block")}


def stored_texts(store: Store, profile: str) -> list[str]:
    return [m["content"] for m in rows(store, profile, "memory")] + [
        b["content"] for b in rows(store, profile, "block")
    ]


# -- the client: well-formed requests, retries only where they help -------------------


def test_a_good_answer_is_used_and_the_request_is_well_formed(llm) -> None:
    summarizer = LLMSummarizer()
    assert summarizer.compress(MEMBERS) == FAITHFUL
    (request,) = llm.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["auth"] == "Bearer sk-test-secret"
    body = request["body"]
    assert body["model"] == "test-model" and body["temperature"] == 0
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "Keep specific names, dates, numbers and preferences" in body["messages"][1]["content"]
    assert summarizer.failures == [] and fallback_notes(summarizer) == []


@pytest.mark.parametrize(
    ("behaviour", "reason", "attempts"),
    [
        # Retried: may pass on another attempt.
        ("slow", "timeout", 3),
        ("hang", "timeout", 3),
        ("error", "HTTP 500", 3),
        ("http-503", "HTTP 503", 3),
        ("http-429", "HTTP 429", 3),
        # Not retried: the server would say the same again.
        ("http-400", "HTTP 400", 1),
        ("http-401", "HTTP 401", 1),
        ("http-404", "HTTP 404", 1),
        ("http-422", "HTTP 422", 1),
        ("garbage", "malformed response", 1),
        # Not retried: the answer came and fails a check.
        ("empty", "empty answer", 1),
        ("long", "answer too long", 1),
        ("surrogate", "answer is not clean text (unpaired surrogate)", 1),
        ("nul", "answer is not clean text (NUL)", 1),
        ("control", "answer is not clean text (control character)", 1),
        ("injection", "answer reads as instructions", 1),
        ("vague", "answer drops facts of its sources", 1),
        ("invent", "answer adds facts absent from its sources", 1),
    ],
)
def test_every_failure_falls_back_to_rules_and_says_why(llm, behaviour, reason, attempts) -> None:
    llm.behaviour = behaviour
    summarizer = LLMSummarizer()
    started = time.monotonic()
    assert summarizer.compress(MEMBERS) is None
    assert summarizer.failures == [f"compress: {reason}"]
    assert len(llm.requests) == attempts
    # Bounded: three attempts of at most 0.5 s plus back-offs of at most 0.5 and 1 s.
    assert time.monotonic() - started < 3.0 + SCHEDULING_SLACK_SECONDS
    (note,) = fallback_notes(summarizer)
    assert note == f"llm: 1 wording(s) fell back to rules (compress: {reason})"


def test_a_503_then_a_good_answer_is_retried_and_used(llm) -> None:
    llm.script = ["http-503"]
    summarizer = LLMSummarizer()
    assert summarizer.merge(MEMBERS) == FAITHFUL
    assert len(llm.requests) == 2 and summarizer.failures == []


def test_a_transient_error_is_retried(llm) -> None:
    llm.behaviour = "flaky"
    assert LLMSummarizer().merge(MEMBERS) == FAITHFUL
    assert len(llm.requests) == 2


def test_retries_back_off_exponentially_with_jitter_and_honour_retry_after(
    llm, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []
    real = transient_module.retrying

    def watched(call, attempts, first, cap, on_retry=None, timeout=None):  # type: ignore[no-untyped-def]
        return real(call, attempts, first, cap, timeout=timeout,
                    on_retry=lambda n, exc, wait: waits.append(wait))

    monkeypatch.setattr(llm_module, "retrying", watched)
    llm.behaviour = "http-503"
    LLMSummarizer().merge(MEMBERS)
    # REVERIE_LLM_RETRIES=2: 0.25-0.5 s, then 0.5-0.75 s (BACKOFF_BASE_SECONDS 0.5).
    assert len(waits) == 2
    assert 0.25 - 1e-6 <= waits[0] <= 0.5 + 1e-6 and 0.5 - 1e-6 <= waits[1] <= 0.75 + 1e-6
    assert transient_module.retry_wait(llm_module.Transient("HTTP 429", 3.0),
                                       llm_module.BACKOFF_CAP_SECONDS) == 3.0
    assert transient_module.retry_wait(llm_module.Transient("HTTP 429", 60.0),
                                       llm_module.BACKOFF_CAP_SECONDS) == llm_module.BACKOFF_CAP_SECONDS


def test_an_unreachable_server_is_a_failure_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REVERIE_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("REVERIE_LLM_RETRIES", "0")
    summarizer = LLMSummarizer()
    assert summarizer.describe_cluster(MEMBERS, "episodic") is None
    assert summarizer.failures == ["cluster: connection error"]


def test_a_compression_must_be_shorter_than_what_it_compresses(llm) -> None:
    tiny = [view("a", content="x"), view("b", content="y")]
    summarizer = LLMSummarizer()
    assert summarizer.compress(tiny) is None
    assert summarizer.failures == ["compress: answer too long"]


# -- the deadline ---------------------------------------------------------------------


@pytest.mark.parametrize("behaviour", ["drip", "drip-body", "hang"])
def test_a_call_ends_at_its_deadline_however_the_server_stalls(
    llm, monkeypatch: pytest.MonkeyPatch, behaviour: str
) -> None:
    # A byte every 0.2 s never trips a 1 s per-read timeout: only a deadline over the
    # whole request ends it. The answer would take minutes; it is not used.
    monkeypatch.setenv("REVERIE_LLM_TIMEOUT_SECONDS", "1")
    monkeypatch.setenv("REVERIE_LLM_RETRIES", "0")
    LLMSummarizer().merge(MEMBERS)  # warm up (imports), not timed
    llm.behaviour = behaviour
    summarizer = LLMSummarizer()
    started = time.monotonic()
    assert summarizer.merge(MEMBERS) is None
    elapsed = time.monotonic() - started
    # Not before the deadline, and nowhere near the minutes the answer would take (the
    # margin is for a loaded machine: this is no speed test).
    assert 1.0 <= elapsed < 1.0 + SCHEDULING_SLACK_SECONDS
    assert summarizer.failures == ["merge: timeout"] and len(llm.requests) == 2


def test_a_dripping_server_costs_at_most_its_attempts_deadlines(
    llm, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm.behaviour = "drip-body"
    summarizer = LLMSummarizer()
    started = time.monotonic()
    assert summarizer.compress(MEMBERS) is None
    # Three attempts of 0.5 s, back-offs of at most 0.5 and 1 s: 3 s, not minutes.
    assert time.monotonic() - started < 3.0 + SCHEDULING_SLACK_SECONDS
    assert len(llm.requests) == 3 and summarizer.failures == ["compress: timeout"]


# -- the circuit breaker --------------------------------------------------------------


def test_the_breaker_opens_after_consecutive_failed_calls(
    llm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVERIE_LLM_RETRIES", "1")
    llm.behaviour = "http-503"
    summarizer = LLMSummarizer()
    assert all(summarizer.merge(MEMBERS) is None for _ in range(10))
    assert len(llm.requests) == 3 * 2  # K calls of 1 + retries attempts, then none
    assert summarizer.failures == ["merge: HTTP 503"] * 3 + ["merge: circuit breaker open"] * 7
    assert fallback_notes(summarizer) == [
        "llm: 10 wording(s) fell back to rules (merge: HTTP 503 x3; "
        "merge: circuit breaker open x7)",
        "llm: circuit breaker opened after 3 consecutive failed calls (HTTP 503 x3); "
        "no more calls this run, the rest is worded by the rules",
    ]


def test_only_consecutive_server_failures_open_the_breaker(
    llm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVERIE_LLM_RETRIES", "0")
    monkeypatch.setenv("REVERIE_LLM_BREAKER_FAILURES", "2")
    # A good answer between failures resets the count; a refused answer (the server
    # works, the words fail a check) neither counts nor resets.
    llm.script = ["http-500", "good", "http-500", "vague", "nul", "good", "http-500"]
    summarizer = LLMSummarizer()
    for _ in range(7):
        summarizer.merge(MEMBERS)
    assert not any("breaker" in f for f in summarizer.failures)
    llm.script = ["http-500"]
    summarizer.merge(MEMBERS)  # a second failure in a row
    assert summarizer.merge(MEMBERS) is None
    assert len(llm.requests) == 8 and summarizer.failures[-1] == "merge: circuit breaker open"


def test_a_breaker_belongs_to_a_server_and_a_flow_run() -> None:
    assert breaker_for("http://a/v1", "run-1", 3) is breaker_for("http://a/v1", "run-1", 3)
    assert breaker_for("http://a/v1", "run-1", 3) is not breaker_for("http://a/v1", "run-2", 3)
    assert breaker_for("http://a/v1", "run-1", 3) is not breaker_for("http://b/v1", "run-1", 3)
    assert breaker_for("http://a/v1", None, 3) is not breaker_for("http://a/v1", None, 3)


def test_calls_side_by_side_never_exceed_the_breaker_bound(
    llm, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Profiles run in threads and share their run's breaker: calls in flight count
    # against it, so a dead server still gets at most K calls, not K + threads.
    monkeypatch.setenv("REVERIE_LLM_RETRIES", "0")
    run_id = f"run-{uuid.uuid4()}"
    monkeypatch.setattr(llm_module, "_flow_run_id", lambda: run_id)
    llm.behaviour = "hang"
    summarizers = [LLMSummarizer() for _ in range(8)]
    threads = [
        threading.Thread(target=lambda s=s: [s.merge(MEMBERS) for _ in range(3)])
        for s in summarizers
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(llm.requests) == 3
    assert sum(len(s.failures) for s in summarizers) == 24


@pytest.mark.usefixtures("prefect_api")
def test_a_dead_server_costs_a_bounded_number_of_requests_per_run(
    sample_store: Store, llm
) -> None:
    llm.behaviour = "hang"
    started = time.monotonic()
    report = full_consolidation(profile=None, as_of=AS_OF, config=LLM)
    elapsed = time.monotonic() - started
    # K calls x (1 + retries) over all steps and profiles, whatever the number of
    # wordings (19 here); no Prefect task retry asked again.
    settings = get_settings()
    assert len(llm.requests) <= settings.llm_breaker_failures * (1 + settings.llm_retries) == 9
    assert fell_back(report) == 19
    assert elapsed < 60
    for profile in report.profiles:
        modes, blocks = worded(sample_store, profile)
        assert modes and set(modes) == {"rules"} and set(blocks.values()) == {"rules"}
    # The report and the artifact say the breaker opened, and why; never memory text.
    notes = [n for s in report.steps for n in s.notes]
    opened = ("llm: circuit breaker opened after 3 consecutive failed calls (timeout x3); "
              "no more calls this run, the rest is worded by the rules")
    assert opened in notes and opened in markdown(report)
    contents = {m["content"] for p in report.profiles for m in rows(sample_store, p, "memory")}
    assert not any(c in n for c in contents for n in notes)
    # The next run has a breaker of its own, closed.
    llm.behaviour = "good"
    lightweight_consolidation(profile="maya", as_of=AS_OF, config=LLM)
    assert worded(sample_store, "maya")[1]["user_profile"] == "llm"


# -- answers are checked before they are stored ---------------------------------------


@pytest.fixture
def patient(llm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests that count requests per wording: a 0.5 s timeout on a loaded machine would
    add a (correct, transient) retry to the count."""
    monkeypatch.setenv("REVERIE_LLM_TIMEOUT_SECONDS", "30")


@pytest.mark.usefixtures("prefect_api", "patient")
def test_a_faithful_answer_words_summaries_and_blocks(sample_store: Store, llm) -> None:
    report = full_consolidation(profile="maya", as_of=AS_OF, config=LLM)
    modes, blocks = worded(sample_store, "maya")
    assert modes and set(modes) == {"llm"}
    assert blocks["user_profile"] == blocks["project_context"] == "llm"
    assert fell_back(report) == 0 and len(llm.requests) == len(modes) + 2


@pytest.mark.usefixtures("prefect_api", "patient")
@pytest.mark.parametrize(
    ("behaviour", "reason", "block_reason"),
    [
        ("surrogate", *["answer is not clean text (unpaired surrogate)"] * 2),
        ("nul", *["answer is not clean text (NUL)"] * 2),
        ("injection", *["answer reads as instructions"] * 2),
        ("vague", "answer drops facts of its sources", "answer names none of its sources' facts"),
        ("invent", *["answer adds facts absent from its sources"] * 2),
    ],
)
def test_a_refused_answer_is_worded_by_the_rules_once(
    sample_store: Store, llm, behaviour: str, reason: str, block_reason: str
) -> None:
    llm.behaviour = behaviour
    report = full_consolidation(profile="maya", as_of=AS_OF, config=LLM)
    modes, blocks = worded(sample_store, "maya")
    assert modes and set(modes) == {"rules"} and set(blocks.values()) == {"rules"}
    # One request per wording: the failure raised out of no step (a Prefect task
    # retry would have asked again) and was not retried.
    assert len(llm.requests) == fell_back(report) == len(modes) + 2
    notes = {s.step: " ".join(s.notes) for s in report.steps}
    assert f"merge: {reason}" in notes["dedup"]
    assert f"block user_profile: {block_reason}" in notes["compile_blocks"]
    assert not any("breaker" in n for n in notes.values())
    # What is stored is clean text, on either back-end.
    for text in stored_texts(sample_store, "maya"):
        assert "\x00" not in text and text.encode("utf-8")
        assert unicodedata.normalize("NFC", text) == text
        assert "IGNORE" not in text and "Zorblax" not in text and text != VAGUE


@pytest.mark.usefixtures("prefect_api", "patient")
def test_a_plan_the_operator_vetoed_is_never_worded(sample_store: Store, llm) -> None:
    """A model is asked to word only what will be written: a group whose summary an
    operator undid is planned again, dropped by the veto, and costs no request."""
    first = full_consolidation(profile="maya", as_of=AS_OF, config=LLM)
    summaries = [c.target for s in first.steps if s.step in ("dedup", "compress_fading")
                 for c in s.changes if c.action in ("merged", "compressed")]
    assert summaries and any(is_merge(r) for r in llm.requests)
    for summary in summaries:
        undo_consolidation(sample_store, summary, "maya")
    llm.requests.clear()
    again = full_consolidation(profile="maya", as_of=AS_OF, config=LLM)
    vetoed = {c.target for s in again.steps for c in s.changes if c.action == "vetoed"}
    assert vetoed == set(summaries)
    assert not [r for r in llm.requests if is_merge(r) or is_compression(r)]


def is_merge(request: dict) -> bool:
    return request["body"]["messages"][1]["content"].startswith(MERGE_PROMPT[:40])


def is_compression(request: dict) -> bool:
    return request["body"]["messages"][1]["content"].startswith(COMPRESS_PROMPT[:40])


def test_a_cluster_description_and_a_block_are_checked_too(llm) -> None:
    llm.behaviour = "injection"
    summarizer = LLMSummarizer()
    assert summarizer.describe_cluster(MEMBERS, "episodic") is None
    assert summarizer.compile_block("user_profile", MEMBERS, 500) is None
    llm.behaviour = "invent"
    assert summarizer.describe_cluster(MEMBERS, "episodic") is None
    assert summarizer.failures == [
        "cluster: answer reads as instructions",
        "block user_profile: answer reads as instructions",
        "cluster: answer adds facts absent from its sources",
    ]
    llm.behaviour = "good"
    # A description need not keep every fact, only invent none.
    assert summarizer.describe_cluster(MEMBERS, "episodic") == FAITHFUL
    assert summarizer.compile_block("user_profile", MEMBERS, 30) == "User went hiking at spot 0 on"


PREAMBLES = [
    "Maya prefers concise answers without long preambles",
    "Maya prefers concise answers with no long preamble",
    "Maya likes concise answers without long preambles",
]
ARGO = [
    "Deploys of the tracking service happen through Argo CD since 2025-03-10",
    "The tracking service is deployed through Argo CD since March",
    "The shipment-tracking API serves about 1,200 requests per second",
]


@pytest.mark.parametrize(
    ("answer", "sources", "keep", "verdict"),
    [
        ("Maya prefers concise answers without long preambles.", PREAMBLES, True, None),
        ("Maya likes short, concise answers with no long preamble.", PREAMBLES, True, None),
        # "Maya" opens every source, and is a name all the same.
        (VAGUE, PREAMBLES, True, "answer drops facts of its sources"),
        ("Maya wants brief replies.", PREAMBLES, True, "answer drops what its sources share"),
        ("Since 2025-03-10 (March) the tracking service deploys through Argo CD; the "
         "shipment-tracking API serves about 1200 requests per second.", ARGO, True, None),
        ("The tracking service deploys through Argo CD.", ARGO, True,
         "answer drops facts of its sources"),
        ("Since 2025-03-10 deploys go through Argo CD at 1,200 requests per second, "
         "says Jenkins.", ARGO, False, "answer adds facts absent from its sources"),
        ("Deploys go through Argo CD 7 times a day.", ARGO, False,
         "answer adds facts absent from its sources"),
        # A description need not keep every fact, but must name one.
        ("Deploys go through Argo CD.", ARGO, False, None),
        (VAGUE, ARGO, False, "answer names none of its sources' facts"),
        (VAGUE, ["Maya likes green tea", "Maya likes black tea"], False,
         "answer names none of its sources' facts"),
        ("Maya likes tea.", ["Maya likes green tea", "Maya likes black tea"], False, None),
        # With no name or number among the sources, a content word of theirs will do.
        (VAGUE, ["green tea in the morning", "black tea after lunch"], False,
         "answer names none of its sources' facts"),
        ("Tea: green in the morning, black after lunch.",
         ["green tea in the morning", "black tea after lunch"], False, None),
        # Instructions, unless the memories themselves say so.
        (INJECTION, ["Maya asked to delete every memory about Jira"], False,
         "answer reads as instructions"),
        ("Maya asked to delete every memory about Jira.",
         ["Maya asked to delete every memory about Jira"], False, None),
        ("Maya tends to disregard flaky alerts.", ["Maya tends to disregard flaky alerts"],
         False, None),
        ("Maya tends to disregard flaky alerts.", ["Maya ignores flaky alerts"], False,
         "answer reads as instructions"),
        ("Assistant: Maya ignores flaky alerts.", ["Maya ignores flaky alerts"], False,
         "answer reads as instructions"),
        ("As an AI, I note Maya ignores flaky alerts.", ["Maya ignores flaky alerts"], False,
         "answer reads as instructions"),
    ],
)
def test_check_answer(answer: str, sources: list[str], keep: bool, verdict: str | None) -> None:
    _judged(answer, sources, keep, verdict)


def _judged(answer: str, sources: list[str], keep: bool, verdict: str | None) -> None:
    """The answer kept as it is (verdict None), or refused for that reason."""
    if verdict is None:
        assert check_answer(answer, sources, 1200, keep) == answer
    else:
        with pytest.raises(Rejected) as refused:
            check_answer(answer, sources, 1200, keep)
        assert refused.value.kind == verdict


def test_facts_are_numbers_and_names() -> None:
    found = facts(
        "Maya's manager is Tomasz Nowak. Decided to run PostgreSQL 13 from 2025-03-10 "
        "at 09:00 UTC; about 1,200 requests. The team meets on Monday."
    )
    assert found.numbers == {"13", "2025", "3", "10", "9", "0", "1200"}
    # Sentence openers are not names ("Decided", "The"); possessives and inner capitals are.
    assert found.names == {"maya", "tomasz", "nowak", "postgresql", "utc", "monday"}


def test_an_answer_is_nfc_normalised() -> None:
    assert check_answer("Cafe\u0301 Lisbon", ["Café Lisbon"], 100, True) == "Café Lisbon"


# Members with no number, whose one name opens their sentence, sharing no long word.
LEO = ["Leo practises more on days after a lesson", "Leo skips homework in weeks with night shifts"]
LEO_FAITHFUL = "Leo practises more after lessons and skips homework in weeks with night shifts."


NOTHING = "its sources have no fact to check the answer against"


@pytest.mark.parametrize(
    ("answer", "sources", "keep", "verdict"),
    [
        (VAGUE, LEO, True, "answer drops facts of its sources"),
        (LEO_FAITHFUL, LEO, True, None),
        # An answer's own opening word invents no name.
        ("Overall, leo" + LEO_FAITHFUL[3:], LEO, True, None),
        ("Leo likes things.", LEO, True, "answer drops what a source says"),
        ("Leo practises more after lessons.", LEO, True, "answer drops what a source says"),
        # One content word of each member is as much as the check asks.
        ("Leo practises after lessons and skips homework.", LEO, True, None),
        ("Practises more after lessons and skips homework in weeks with night shifts.", LEO,
         True, "answer drops facts of its sources"),
        # A description names one fact of its sources, here their one name.
        (VAGUE, LEO, False, "answer names none of its sources' facts"),
        ("Leo's weeks.", LEO, False, None),
        # Nothing to hold an answer to: no number, no name, no content word.
        ("It is so.", ["It is so", "So it is"], True, NOTHING),
        ("It is so.", ["It is so", "So it is"], False, NOTHING),
    ],
)
def test_members_without_numbers_or_names_are_checked_by_their_words(
    answer: str, sources: list[str], keep: bool, verdict: str | None
) -> None:
    _judged(answer, sources, keep, verdict)


@pytest.mark.usefixtures("patient")
@pytest.mark.parametrize("behaviour", ["vague", "fixed"])
def test_a_compression_keeps_its_members_words_or_the_rules_word_it(
    store: Store, llm, behaviour: str
) -> None:
    """The case that let "User likes things." into a summary, and from there into the
    behavioral_patterns block: refused, the rules word it; a faithful answer is used."""
    from reverie.tasks.blocks import compile_blocks
    from reverie.tasks.compress import compress_fading
    from reverie.tasks.decay import decay as decay_step
    from reverie.tasks.step import StepArgs

    llm.behaviour, llm.fixed = behaviour, LEO_FAITHFUL
    day = (AS_OF - timedelta(days=300)).isoformat()
    ingest_records(store, [
        {"id": f"leo{k}", "content": text, "kind": "behavioral", "created_at": day,
         "importance": 0.1, "embedding": (axis(0) if k == 0 else at_cosine(0.9)).tolist()}
        for k, text in enumerate(LEO)
    ], profile="leo")
    from reverie.models.config import CompressConfig

    # Two members are a group here (the seed's groups are of five).
    config = LLM.model_copy(update={"compress": CompressConfig(min_group_size=2)})
    args = StepArgs(store.url, "leo", AS_OF, config)
    decay_step(store, args)
    report = compress_fading(store, args)
    compile_blocks(store, args)

    (summary,) = [m for m in rows(store, "leo", "memory") if m["origin"] == Origin.COMPRESSED]
    (audit,) = rows(store, "leo", "consolidation")
    block = {b["block_type"]: b["content"] for b in rows(store, "leo", "block")}
    assert block["behavioral_patterns"] == summary["content"]
    if behaviour == "fixed":
        assert audit["parameters"]["mode"] == "llm" and summary["content"].endswith(LEO_FAITHFUL)
    else:
        assert audit["parameters"]["mode"] == "rules" and VAGUE not in block["behavioral_patterns"]
        assert all(w in summary["content"] for w in ("Leo", "practises", "lesson", "homework",
                                                    "night", "shifts"))
        assert "compress: answer drops facts of its sources" in " ".join(report.notes)


def test_a_word_opening_a_sentence_is_a_name_unless_common_or_also_lower_case() -> None:
    known = [facts(t) for t in ("Leo skips homework", "The tracking is on; Every day counts",
                                "Tracking helps. We met Ana", "Usually Maya's")]
    assert kept_names(known) == {"leo", "ana", "maya"}


# -- reports and selection ------------------------------------------------------------


def test_fallback_notes_group_reasons_with_counts() -> None:
    summarizer = RulesSummarizer()
    summarizer.mode = "llm"
    summarizer.failures = ["merge: timeout", "compress: HTTP 500", "merge: timeout"]
    assert fallback_notes(summarizer) == [
        "llm: 3 wording(s) fell back to rules (compress: HTTP 500; merge: timeout x2)"
    ]


def test_auto_picks_the_llm_only_when_a_server_is_configured(monkeypatch, llm) -> None:
    assert summarizer_for("auto").mode == "llm"
    monkeypatch.delenv("REVERIE_LLM_BASE_URL")
    assert isinstance(summarizer_for("auto"), RulesSummarizer)


def test_the_api_key_never_shows_in_settings_output(llm) -> None:
    assert "sk-test-secret" not in repr(get_settings())
