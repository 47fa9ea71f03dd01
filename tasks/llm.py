"""LLM summaries through any OpenAI-compatible chat-completions server.

Mode B is a local server (Ollama, vLLM, llama.cpp), Mode C a hosted API: both speak
``POST {base}/chat/completions``. Configured by ``REVERIE_LLM_BASE_URL``,
``REVERIE_LLM_MODEL`` and ``REVERIE_LLM_API_KEY`` (from the environment only).

Every call has a timeout and a bounded number of retries (on timeouts, connection
errors and 5xx answers). An answer must be well-formed, non-empty, no longer than
``REVERIE_LLM_MAX_CHARS`` and, for compression, shorter than what it compresses.
Anything else is a failure: the summarizer returns None, the step uses the rules,
and the failure (never the memory text) is kept in ``failures`` for the report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import httpx

from models.records import MemoryView
from models.settings import Settings, get_settings

log = logging.getLogger(__name__)

SYSTEM = (
    "You maintain the long-term memory of an AI assistant. You rewrite memories "
    "faithfully and concisely. Never invent facts. Answer with the text only."
)
COMPRESS_PROMPT = (
    "Compress these related memories into a single concise summary that keeps every "
    "key fact.\n\nMemories:\n{items}\n\nWrite one clear paragraph. Keep specific names, "
    "dates, numbers and preferences."
)
MERGE_PROMPT = (
    "These memories say nearly the same thing. Write them as one statement that keeps "
    "every detail any of them adds.\n\nMemories:\n{items}"
)
CLUSTER_PROMPT = (
    "These {count} memories, mostly of kind '{kind}', form one recurring theme. Describe "
    "the theme in one or two sentences, naming the concrete things they share.\n\n"
    "Memories:\n{items}"
)
BLOCK_PROMPT = (
    "Write the '{block}' section of an assistant's always-in-context notes about its "
    "user, from these facts. At most {limit} characters, plain prose, no headings.\n\n"
    "Facts:\n{items}"
)


class LLMError(Exception):
    """A call to the model failed or gave an unusable answer (a short reason)."""


def _numbered(memories: Sequence[MemoryView]) -> str:
    return "\n".join(f"{i}. {' '.join(m.content.split())}" for i, m in enumerate(memories, 1))


class ChatClient:
    """A minimal chat-completions client: timeouts, bounded retries, strict parsing."""

    def __init__(self, settings: Settings) -> None:
        if not settings.llm_base_url:
            raise LLMError("REVERIE_LLM_BASE_URL is not set")
        self.url = settings.llm_base_url.rstrip("/") + "/chat/completions"
        self.model = settings.llm_model
        self.retries = settings.llm_retries
        headers = {"Content-Type": "application/json"}
        if settings.llm_api_key is not None:
            headers["Authorization"] = f"Bearer {settings.llm_api_key.get_secret_value()}"
        self._http = httpx.Client(timeout=settings.llm_timeout_seconds, headers=headers)

    def complete(self, prompt: str, max_tokens: int) -> str:
        body = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": prompt},
            ],
            "temperature": 0,
            "max_tokens": max_tokens,
        }
        reason = "no attempt made"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(0.5 * 2 ** (attempt - 1), 4.0))
            try:
                response = self._http.post(self.url, json=body)
            except httpx.TimeoutException:
                reason = "timeout"
                continue
            except httpx.HTTPError as exc:
                reason = f"connection error ({type(exc).__name__})"
                continue
            if response.status_code >= 500:
                reason = f"HTTP {response.status_code}"
                continue
            if response.status_code >= 400:
                raise LLMError(f"HTTP {response.status_code}")
            return _answer(response)
        raise LLMError(reason)

    def close(self) -> None:
        self._http.close()


def _answer(response: httpx.Response) -> str:
    try:
        payload = response.json()
        content = payload["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise LLMError("malformed response") from None
    if not isinstance(content, str) or not content.strip():
        raise LLMError("empty answer")
    return " ".join(content.split())


class LLMSummarizer:
    """Summaries worded by a model; any failure yields None so the step uses the rules."""

    mode = "llm"

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.failures: list[str] = []
        self._client: ChatClient | None = None

    def _ask(self, what: str, prompt: str, limit: int) -> str | None:
        try:
            if self._client is None:
                self._client = ChatClient(self.settings)
            text = self._client.complete(prompt, max_tokens=max(64, limit // 3))
            if len(text) > limit:
                raise LLMError(f"answer too long ({len(text)} > {limit} characters)")
            return text
        except LLMError as exc:
            self.failures.append(f"{what}: {exc}")
            log.warning("llm %s failed: %s; using rules", what, exc)
            return None

    def merge(self, representative: MemoryView, members: Sequence[MemoryView]) -> str | None:
        return self._ask("merge", MERGE_PROMPT.format(items=_numbered(members)),
                         self.settings.llm_max_chars)

    def compress(self, members: Sequence[MemoryView]) -> str | None:
        source = sum(len(m.content) for m in members)
        return self._ask("compress", COMPRESS_PROMPT.format(items=_numbered(members)),
                         min(self.settings.llm_max_chars, max(source - 1, 1)))

    def describe_cluster(self, members: Sequence[MemoryView], dominant_kind: str) -> str | None:
        prompt = CLUSTER_PROMPT.format(count=len(members), kind=dominant_kind,
                                       items=_numbered(members[:20]))
        return self._ask("cluster", prompt, self.settings.llm_max_chars)

    def compile_block(
        self, block_type: str, facts: Sequence[MemoryView], char_limit: int
    ) -> str | None:
        prompt = BLOCK_PROMPT.format(block=block_type, limit=char_limit, items=_numbered(facts))
        return self._ask(f"block {block_type}", prompt, char_limit)
