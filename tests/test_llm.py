"""LLM summaries against a real chat-completions server on loopback."""

from __future__ import annotations

import time

import pytest

from models.settings import get_settings
from tasks.llm import LLMSummarizer
from tasks.summarize import RulesSummarizer, fallback_notes, summarizer_for

from factories import view

MEMBERS = [view(f"m{i}", content=f"User went hiking at spot {i} on March {10 + i}") for i in range(5)]


def test_a_good_answer_is_used_and_the_request_is_well_formed(llm) -> None:
    summarizer = LLMSummarizer()
    assert summarizer.compress(MEMBERS) == "LLM summary of 5 memories."
    (request,) = llm.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["auth"] == "Bearer sk-test-secret"
    body = request["body"]
    assert body["model"] == "test-model" and body["temperature"] == 0
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "Keep specific names, dates, numbers and preferences" in body["messages"][1]["content"]
    assert summarizer.failures == []


@pytest.mark.parametrize(
    ("behaviour", "reason", "attempts"),
    [
        ("slow", "timeout", 3),
        ("error", "HTTP 500", 3),
        ("garbage", "malformed response", 1),
        ("empty", "empty answer", 1),
        ("long", "answer too long", 1),
    ],
)
def test_every_failure_falls_back_to_rules_and_says_why(llm, behaviour, reason, attempts) -> None:
    llm.behaviour = behaviour
    summarizer = LLMSummarizer()
    started = time.monotonic()
    assert summarizer.compress(MEMBERS) is None
    assert len(summarizer.failures) == 1 and reason in summarizer.failures[0]
    assert len(llm.requests) == attempts
    # Bounded: three attempts of at most 0.5 s plus short back-offs.
    assert time.monotonic() - started < 5
    (note,) = fallback_notes(summarizer)
    assert note.startswith("llm: 1 wording(s) fell back to rules") and reason in note


def test_a_transient_error_is_retried(llm) -> None:
    llm.behaviour = "flaky"
    assert LLMSummarizer().merge(MEMBERS[0], MEMBERS) == "LLM summary of 5 memories."
    assert len(llm.requests) == 2


def test_an_unreachable_server_is_a_failure_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REVERIE_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("REVERIE_LLM_RETRIES", "0")
    summarizer = LLMSummarizer()
    assert summarizer.describe_cluster(MEMBERS, "episodic") is None
    assert "connection error" in summarizer.failures[0]


def test_a_compression_must_be_shorter_than_what_it_compresses(llm) -> None:
    tiny = [view("a", content="x"), view("b", content="y")]
    summarizer = LLMSummarizer()
    assert summarizer.compress(tiny) is None
    assert "too long" in summarizer.failures[0]


def test_auto_picks_the_llm_only_when_a_server_is_configured(monkeypatch, llm) -> None:
    assert summarizer_for("auto").mode == "llm"
    monkeypatch.delenv("REVERIE_LLM_BASE_URL")
    assert isinstance(summarizer_for("auto"), RulesSummarizer)


def test_the_api_key_never_shows_in_settings_output(llm) -> None:
    assert "sk-test-secret" not in repr(get_settings())
