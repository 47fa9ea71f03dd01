"""Shared fixtures: one Prefect test harness and one embedding model per session,
and a fresh SQLite store per test (the store Reverie's settings point at)."""

from __future__ import annotations

import os

# Before Prefect or sentence-transformers are imported anywhere.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments.demo import SAMPLE_STORE
from models.db import dispose
from models.store import Store


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    """A temporary Prefect API for the whole session (starting one costs seconds)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """An empty store that Reverie's settings (and so every flow) point at."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("REVERIE_DATABASE_URL", url)
    yield Store(url)
    dispose(url)


@pytest.fixture(scope="session")
def sample_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled sample store, ingested once per session (embedding it costs seconds)."""
    path = tmp_path_factory.mktemp("sample") / "sample.db"
    url = f"sqlite:///{path}"
    report = Store(url).ingest_jsonl(SAMPLE_STORE)
    assert not report.errors
    dispose(url)
    return path


@pytest.fixture
def sample_store(store: Store, sample_template: Path) -> Store:
    """A fresh copy of the ingested sample store, as the test's store."""
    dispose(store.url)
    shutil.copyfile(sample_template, store.url.removeprefix("sqlite:///"))
    return store


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """A chat-completions server on loopback that Reverie's settings point at."""
    from llm_server import FakeLLM

    server = FakeLLM()
    monkeypatch.setenv("REVERIE_LLM_BASE_URL", server.url)
    monkeypatch.setenv("REVERIE_LLM_MODEL", "test-model")
    monkeypatch.setenv("REVERIE_LLM_API_KEY", "sk-test-secret")
    monkeypatch.setenv("REVERIE_LLM_TIMEOUT_SECONDS", "0.5")
    monkeypatch.setenv("REVERIE_LLM_RETRIES", "2")
    yield server
    server.close()
