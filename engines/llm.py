"""LLM summaries through any OpenAI-compatible chat-completions server.

Mode B is a local server (Ollama, vLLM, llama.cpp), Mode C a hosted API: both speak
``POST {base}/chat/completions``. Configured by ``REVERIE_LLM_BASE_URL``,
``REVERIE_LLM_MODEL`` and ``REVERIE_LLM_API_KEY`` (from the environment only).

A model is a boundary Reverie does not own, so everything it says is bounded and
checked, and any failure means the step words that summary by the rules (Mode A) and
says why in its report (reason kinds and counts, never memory text):

Deadline
    ``REVERIE_LLM_TIMEOUT_SECONDS`` bounds one whole request: connect, send and every
    byte of the answer. httpx's timeouts are per socket operation (a server sending a
    byte a second never trips them), so a watchdog shuts the request's socket down at
    the deadline, whatever stage it is in; an answer completed after it is not used.
    Answers over ``MAX_RESPONSE_BYTES`` are cut off. Not bounded: the DNS look-up.

Retries
    Only what may pass is retried: timeouts, connection errors, HTTP 429 and 5xx, at
    most ``REVERIE_LLM_RETRIES`` times, with exponential back-off and jitter (a
    ``Retry-After`` up to the cap is honoured): Reverie's one retry
    (``models.transient.retrying``, on stamina). 4xx, malformed JSON and any answer
    that fails a check below would fail the same way again: they are not retried, and
    no failure ever raises out of a step (Prefect's task retries would ask again).

Circuit breaker
    After ``REVERIE_LLM_BREAKER_FAILURES`` consecutive failed calls (a call is one
    wording, with its retries; it fails when the server gives no well-formed answer)
    the breaker opens: no further call is made for the rest of the flow run, and every
    later wording uses the rules. Scope: one breaker per (base URL, Prefect flow run)
    in a process, shared by every step and profile of the run, so a dead server costs
    at most K x (1 + retries) requests per run. To keep that bound with profiles
    running side by side, at most K minus the current failure count calls are in
    flight at once. Outside a flow run the breaker is the summarizer's own (one step).
    With Dask each worker process keeps its own. An answer that arrives but fails a
    check is not a server failure: it neither counts nor opens the breaker.

Checks on an answer (``check_answer``), in order
    1. Clean text, as ingest requires (``models.text``): NFC; no NUL, no unpaired
       surrogate; and no other control character or bidi override.
    2. Non-empty, within the length cap (``REVERIE_LLM_MAX_CHARS``, a block's own
       limit), and for compression shorter than what it compresses.
    3. Does not read as instructions: ``INSTRUCTION_PATTERNS`` (orders to ignore or
       disregard instructions, role markers such as ``SYSTEM:``, chat-template tokens,
       "you are now", "as an AI", "delete every/all ..."). A match whose words also
       appear in the sources is allowed (a memory may quote such a phrase).
    4. No invented facts (every wording): each number and name of the answer must
       occur in its sources.
    5. Something to check against: sources with no number, name or content word give
       the check nothing to hold an answer to, so any answer is refused.
    6. No lost facts. Merge and compress: each number and name of the members must
       occur in the answer, at least half of the content words every member shares,
       and at least one content word of each member (so "User likes things." cannot
       stand for specific memories). Cluster descriptions and blocks sum up many
       memories in few words: they must name at least one of their sources' names or
       numbers, or with none among the sources, use one of their content words.

Facts, by a deliberately small heuristic (``facts``, ``kept_names``):
    - numbers: each run of digits, leading zeros dropped, thousands separators
      joined ("1,200" is 1200; "2025-03-10" gives 2025, 3 and 10; "09:00" gives 9, 0);
    - names: words with a capital that are not the first word of a sentence (after
      ``. ! ? : ;``, a bullet, or at the start), plus, wherever they stand, words with
      a capital after the first letter (PostgreSQL, UTC, Q1 counts as a number) and
      possessives (Maya's). Month and day names count as names, so dates are covered.
      What an answer must keep of its sources also counts a capitalised word opening
      a sentence ("Leo skips homework") unless it is a common opening word (the, every,
      usually... ``_OPENING_WORDS``) or some source writes it in lower case. An answer's
      own opening word is never a name ("Overall, ..." invents nothing).
    - content words: words of four letters or more that are not common function words
      (``_COMMON``), compared by their first five letters ("lessons" ~ "lesson").
    Names are compared case-insensitively as whole words; a possessive "'s" is dropped.
    Limits, all erring towards the rules: a name after an abbreviation ("Dr. Smith") is
    not a name; a capitalised verb opening a note ("Decided to ...") is held to as a
    name; numbers written as words ("three") are not numbers; an answer that writes
    "March 10, 2025" for "2025-03-10" invents "March"; a paraphrase that drops shared
    words ("brief replies" for "concise answers") is refused. Spelling variants and
    synonyms are not facts the check can see, and one word in common with each member
    is all the check asks of its content words.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import httpx

from reverie.models.errors import TransientError
from reverie.models.records import MemoryView
from reverie.models.settings import Settings, get_settings
from reverie.models.text import clean_text, refuse_controls
from reverie.models.transient import retrying

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
# Members a cluster prompt lists: enough to name a theme, short enough for any model.
CLUSTER_PROMPT_MEMBERS = 20

# A chat answer of a few hundred tokens is a few kilobytes; more is not an answer.
MAX_RESPONSE_BYTES = 1 << 20
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_CAP_SECONDS = 4.0
# Flow runs whose breakers a long-lived worker remembers (older runs have ended).
REMEMBERED_RUNS = 64


# Errors, grouped by what the caller can do. ``kind`` is a fixed phrase (no memory text,
# no server text) so that reports can count failures by it.
class LLMError(Exception):
    """A call failed or its answer is unusable; the caller uses the rules."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class Transient(LLMError, TransientError):
    """The server may do better on another attempt: retried (``models.transient``),
    then a failed call."""

    def __init__(self, kind: str, retry_after: float | None = None) -> None:
        super().__init__(kind)
        self.retry_after = retry_after


class Refused(LLMError):
    """The server failed in a way it would repeat: not retried; a failed call."""


class Rejected(LLMError):
    """The server answered, but the answer fails a check: not retried, not a failed
    call (the server works; the next prompt is another one)."""


class BreakerOpen(LLMError):
    """Too many consecutive failed calls in this run: no call was made."""


def _numbered(texts: Sequence[str]) -> str:
    return "\n".join(f"{i}. {' '.join(t.split())}" for i, t in enumerate(texts, 1))


# -- the deadline ---------------------------------------------------------------------


class _Deadline:
    """Ends one request at its deadline: a timer shuts down every socket the request
    opened (httpcore reports them through the ``trace`` extension), which wakes a
    blocked send or read at once. Connecting is bounded by httpx's own connect
    timeout, the same number of seconds."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def trace(self, event: str, info: dict[str, object]) -> None:
        if not event.endswith(("connect_tcp.complete", "start_tls.complete")):
            return
        stream = info.get("return_value")
        sock = getattr(stream, "get_extra_info", lambda _: None)("socket")
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            late = self.expired
        if late:
            _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    def cancel(self) -> None:
        self._timer.cancel()


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed: the request is over anyway
        pass


# -- the client -----------------------------------------------------------------------


class ChatClient:
    """A minimal chat-completions client: a deadline per request, retries only for what
    may pass, strict parsing."""

    def __init__(self, settings: Settings) -> None:
        if not settings.llm_base_url:
            raise Refused("REVERIE_LLM_BASE_URL is not set")
        self.url = settings.llm_base_url.rstrip("/") + "/chat/completions"
        self.model = settings.llm_model
        self.retries = settings.llm_retries
        self.timeout = settings.llm_timeout_seconds
        headers = {"Content-Type": "application/json"}
        if settings.llm_api_key is not None:
            headers["Authorization"] = f"Bearer {settings.llm_api_key.get_secret_value()}"
        # No kept-alive connections: the deadline watchdog learns of a request's socket
        # when it is opened, so every request opens its own.
        self._http = httpx.Client(
            timeout=self.timeout, headers=headers,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

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
        return retrying(lambda: _answer(self._post(body)), self.retries,
                        BACKOFF_BASE_SECONDS, BACKOFF_CAP_SECONDS)

    def _post(self, body: dict[str, object]) -> bytes:
        """The body of one successful response, read before the deadline."""
        deadline = _Deadline(self.timeout)
        try:
            with self._http.stream(
                "POST", self.url, json=body, extensions={"trace": deadline.trace}
            ) as response:
                status = response.status_code
                if status == 429 or status >= 500:
                    raise Transient(f"HTTP {status}", _retry_after(response))
                if not 200 <= status < 300:  # 4xx; a redirect is a wrong base URL
                    raise Refused(f"HTTP {status}")
                data = bytearray()
                for chunk in response.iter_bytes():
                    data += chunk
                    if len(data) > MAX_RESPONSE_BYTES:
                        raise Refused("response too large")
        except httpx.TimeoutException:
            raise Transient("timeout") from None
        except (httpx.NetworkError, httpx.RemoteProtocolError):
            # A shut-down socket surfaces as a read or protocol error.
            kind = "timeout" if deadline.expired else "connection error"
            raise Transient(kind) from None
        except httpx.HTTPError as exc:  # bad URL, proxy refused, undecodable body...
            raise Refused(f"request failed ({type(exc).__name__})") from None
        finally:
            deadline.cancel()
        if deadline.expired:  # finished, but too late: a drip must not buy time
            raise Transient("timeout")
        return bytes(data)

    def close(self) -> None:
        self._http.close()


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(float(response.headers.get("Retry-After", "")), 0.0)
    except ValueError:  # absent, or an HTTP date: use our own back-off
        return None


def _answer(raw: bytes) -> str:
    try:
        content = json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise Refused("malformed response") from None
    if not isinstance(content, str):
        raise Refused("malformed response")
    return content


# -- the circuit breaker --------------------------------------------------------------


class Breaker:
    """Counts consecutive failed calls; open after ``threshold`` of them, for good."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.opened = False
        self.why = ""  # the failure kinds that opened it, counted
        self._failures: list[str] = []  # kinds of the current run of failures
        self._in_flight = 0
        self._cond = threading.Condition()

    def admit(self) -> bool:
        """Whether a call may start; waits while the calls in flight could, by failing,
        open the breaker (so it never lets more than ``threshold`` fail in a row)."""
        with self._cond:
            while not self.opened and len(self._failures) + self._in_flight >= self.threshold:
                self._cond.wait()
            if self.opened:
                return False
            self._in_flight += 1
            return True

    def done(self, failure: str | None) -> bool:
        """Record a call's outcome (its failure kind, or None); True if it opened the breaker."""
        with self._cond:
            self._in_flight -= 1
            opened_now = False
            if failure is None:
                self._failures.clear()
            else:
                self._failures.append(failure)
                if not self.opened and len(self._failures) >= self.threshold:
                    self.opened = opened_now = True
                    self.why = _counted(self._failures)
            self._cond.notify_all()
            return opened_now

    def describe(self) -> str:
        return (
            f"circuit breaker opened after {self.threshold} consecutive failed calls "
            f"({self.why}); no more calls this run, the rest is worded by the rules"
        )


_BREAKERS: OrderedDict[tuple[str, str], Breaker] = OrderedDict()
_BREAKERS_LOCK = threading.Lock()


def breaker_for(base_url: str, run_id: str | None, threshold: int) -> Breaker:
    """The breaker of flow run ``run_id`` for the server at ``base_url``; outside a run,
    a fresh one (the caller's own)."""
    if run_id is None:
        return Breaker(threshold)
    key = (base_url, run_id)
    with _BREAKERS_LOCK:
        breaker = _BREAKERS.get(key)
        if breaker is None:
            breaker = _BREAKERS[key] = Breaker(threshold)
            while len(_BREAKERS) > REMEMBERED_RUNS:
                _BREAKERS.popitem(last=False)
        _BREAKERS.move_to_end(key)
        return breaker


def _flow_run_id() -> str | None:
    """The flow run this code runs in (from a task too), or None outside Prefect."""
    try:
        from prefect.runtime import flow_run

        return flow_run.id
    except Exception:  # noqa: BLE001 - no Prefect context is no run
        return None


def _counted(kinds: Iterable[str]) -> str:
    """"a x3; b": kinds with their counts, in a stable order."""
    return "; ".join(k if n == 1 else f"{k} x{n}" for k, n in sorted(Counter(kinds).items()))


# -- checks on an answer --------------------------------------------------------------

# Orders to the reader, role markers and chat-template tokens: what an injected memory
# or a confused model produces, never what a summary of memories says.
INSTRUCTION_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\b(?:ignore|disregard|forget|override)\b(?:\W+\w+){0,4}?\W+"
        r"(?:instructions?|prompts?|rules|directions|guidelines)\b",
        r"\bdisregard\b",
        r"\b(?:system|assistant|developer)\s*:",
        r"(?:^|[.!?]\s+)user\s*:",
        r"<\|[a-z_]+\|>|\[/?inst\]|<</?sys>>|#{2,}\s*(?:instruction|system|response)",
        r"\byou are now\b|\bfrom now on\b|\bnew instructions\b",
        r"\bas an ai\b",
        r"\b(?:delete|erase|wipe|remove|forget)\s+(?:every|all|each|any)\b",
    )
)
_WORD = re.compile(r"\w+(?:['’]\w+)*")
_THOUSANDS = re.compile(r"(?<=\d)[,_](?=\d{3}(?!\d))")
_DIGITS = re.compile(r"\d+")
_POSSESSIVE = re.compile(r"['’]s$", re.IGNORECASE)
_CAPITAL = re.compile(r"[A-Z]")
_OPENERS = "\"'“‘([{"
_SENTENCE_BREAKS = ".!?:;-–—•*#>\n"
# Words too common to show that an answer kept what its members share.
_COMMON = frozenset(
    "about after again also because been before being both does during each from have "
    "into just more most only other over same since some still such than that their "
    "them then there these they this through under until very were what when where "
    "which while will with within without would your user users".split()
)
# Words that open sentences without being names: a capitalised first word that is none
# of these (and is never written in lower case) is taken for a name (see kept_names).
_OPENING_WORDS = _COMMON | frozenset(
    "a an the it its he she his her hers we our you i my me us him and but or so yet nor "
    "if as at by for in of on to up no not now all any few many much every either neither "
    "here is are was has had do did can could may might must shall should let please "
    "always never often sometimes usually today yesterday tomorrow".split()
)


@dataclass(frozen=True)
class Facts:
    numbers: frozenset[str]
    names: frozenset[str]  # lower-case
    words: frozenset[str]  # every word, lower-case, possessive dropped
    # Capitalised words that only open a sentence here (lower-case): names or not.
    openers: frozenset[str] = frozenset()
    # Words written in lower case here: not names, wherever else they stand.
    lower: frozenset[str] = frozenset()

    @property
    def stems(self) -> frozenset[str]:
        """Content words, crudely stemmed (five letters: 'preambles' ~ 'preamble')."""
        return frozenset(
            w[:5] for w in self.words if len(w) >= 4 and w.isalpha() and w not in _COMMON
        )


def facts(text: str) -> Facts:
    """The numbers, names and words of ``text`` (see the module docstring)."""
    text = _THOUSANDS.sub("", text)
    numbers = {g.lstrip("0") or "0" for g in _DIGITS.findall(text)}
    names: set[str] = set()
    openers: set[str] = set()
    # Word by word in Python, only what the regexes and set operations in C cannot do:
    # dedup reads every hot memory's facts, and at 100k this loop was 3 s of its 11.
    found = _WORD.findall(text)
    if "'" in text or "’" in text:
        found = [_POSSESSIVE.sub("", raw) for raw in found]
        bare = None  # a possessive dropped: each word's place is looked up below
    else:
        bare = found
    words = set(map(str.lower, found))
    lower = set(filter(str.islower, found))
    # Only a capitalised word can be a name: an ASCII text without a capital has none.
    if (not text.isascii() or _CAPITAL.search(text)) and [
            word for word in found if word[:1].isupper()]:
        for match in _WORD.finditer(text):
            raw = match.group(0)
            if not raw[:1].isupper():
                continue
            word = raw if bare is not None else _POSSESSIVE.sub("", raw)
            if any(c.isdigit() for c in word) or word == "I":
                continue
            # A short look back suffices (and keeps long texts linear).
            before = text[max(match.start() - 32, 0) : match.start()]
            before = before.rstrip().rstrip(_OPENERS).rstrip()
            opens_sentence = not before or before[-1] in _SENTENCE_BREAKS
            inner_capital = len(word) > 1 and any(c.isupper() for c in word[1:])
            if not opens_sentence or inner_capital or raw != word:
                names.add(word.lower())
            else:
                openers.add(word.lower())
    return Facts(frozenset(numbers), frozenset(names), frozenset(words),
                 frozenset(openers - names), frozenset(lower))


def kept_names(known: Sequence[Facts]) -> frozenset[str]:
    """The names of sources an answer is held to: their names, and the words that open
    a sentence with a capital unless they are common opening words or written in lower
    case in some source ("Leo" of "Leo skips homework" is a name; "The", "Every" and
    "Tracking" of "Tracking is on; we use tracking" are not)."""
    if len(known) == 1:  # one text's (dedup asks for each of 63k at 100k memories)
        names, openers, lower = known[0].names, known[0].openers, known[0].lower
    else:
        names = frozenset().union(*(k.names for k in known))
        openers = frozenset().union(*(k.openers for k in known))
        lower = frozenset().union(*(k.lower for k in known))
    return names | (openers - lower - _OPENING_WORDS)


def _words_of(text: str) -> str:
    return " ".join(w.lower() for w in _WORD.findall(text))


def check_answer(
    answer: str, sources: Sequence[str], limit: int, keep_facts: bool
) -> str:
    """``answer`` cleaned, if it passes every check; Rejected (with the reason) if not."""
    try:
        text = clean_text(answer)
    except ValueError as exc:
        kind = "NUL" if "NUL" in str(exc) else "unpaired surrogate"
        raise Rejected(f"answer is not clean text ({kind})") from None
    text = " ".join(text.split())
    try:
        refuse_controls(text)
    except ValueError:
        raise Rejected("answer is not clean text (control character)") from None
    if not text:
        raise Rejected("empty answer")
    if len(text) > limit:
        raise Rejected("answer too long")
    source_words = f" {_words_of(' '.join(sources))} "
    for pattern in INSTRUCTION_PATTERNS:
        for match in pattern.finditer(text):
            if f" {_words_of(match.group(0))} " not in source_words:
                raise Rejected("answer reads as instructions")
    said = facts(text)
    known = [facts(s) for s in sources]
    known_numbers = frozenset().union(*(k.numbers for k in known))
    known_words = frozenset().union(*(k.words for k in known))
    if not said.numbers <= known_numbers or not said.names <= known_words:
        raise Rejected("answer adds facts absent from its sources")
    names = kept_names(known)
    stems = frozenset().union(*(k.stems for k in known))
    if not (known_numbers or names or stems):
        # Nothing the answer could be held to: it might say anything.
        raise Rejected("its sources have no fact to check the answer against")
    if not keep_facts:
        # A description need not keep every fact, but must name one (or, with no name
        # or number among its sources, use one of their content words).
        named = known_numbers | names
        if named and not named & (said.numbers | said.words):
            raise Rejected("answer names none of its sources' facts")
        if not named and not stems & said.stems:
            raise Rejected("answer names none of its sources' facts")
    else:
        if not known_numbers <= said.numbers or not names <= said.words:
            raise Rejected("answer drops facts of its sources")
        shared = frozenset.intersection(*(k.stems for k in known))
        if 2 * len(shared & said.stems) < len(shared):
            raise Rejected("answer drops what its sources share")
        # Each member still speaks in the answer, by one of its content words at least.
        if any(k.stems and not k.stems & said.stems for k in known):
            raise Rejected("answer drops what a source says")
    return text


# -- the summarizer -------------------------------------------------------------------


class LLMSummarizer:
    """Summaries worded by a model; any failure yields None so the step uses the rules."""

    mode = "llm"

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        # Why wordings fell back ("merge: timeout"), and run-level events (the breaker).
        self.failures: list[str] = []
        self.events: list[str] = []
        self._client: ChatClient | None = None
        self._breaker: Breaker | None = None

    def _ask(
        self, what: str, prompt: str, limit: int, sources: Sequence[str], keep_facts: bool
    ) -> str | None:
        try:
            answer = self._call(prompt, max_tokens=max(64, limit // 3))
            return check_answer(answer, sources, limit, keep_facts)
        except LLMError as exc:
            self._fell_back(what, exc.kind)
        except Exception as exc:  # noqa: BLE001 - a failure here must not fail the step:
            # Prefect would retry it, and the retry would ask the model again.
            self._fell_back(what, f"internal error ({type(exc).__name__})")
        return None

    def _call(self, prompt: str, max_tokens: int) -> str:
        breaker = self._run_breaker()
        if not breaker.admit():
            self._note_breaker(breaker)
            raise BreakerOpen("circuit breaker open")
        failure: str | None = "internal error"
        try:
            if self._client is None:
                self._client = ChatClient(self.settings)
            answer = self._client.complete(prompt, max_tokens)
            failure = None
            return answer
        except (Transient, Refused) as exc:
            failure = exc.kind
            raise
        finally:
            if breaker.done(failure):
                log.warning("llm %s", breaker.describe())
            if breaker.opened:
                self._note_breaker(breaker)

    def _run_breaker(self) -> Breaker:
        if self._breaker is None:
            self._breaker = breaker_for(
                self.settings.llm_base_url or "", _flow_run_id(),
                self.settings.llm_breaker_failures,
            )
        return self._breaker

    def _note_breaker(self, breaker: Breaker) -> None:
        note = f"{self.mode}: {breaker.describe()}"
        if note not in self.events:
            self.events.append(note)

    def _fell_back(self, what: str, kind: str) -> None:
        self.failures.append(f"{what}: {kind}")
        log.warning("llm %s failed: %s; using rules", what, kind)

    def merge(self, members: Sequence[MemoryView]) -> str | None:
        texts = [m.content for m in members]
        return self._ask("merge", MERGE_PROMPT.format(items=_numbered(texts)),
                         self.settings.llm_max_chars, texts, keep_facts=True)

    def compress(self, members: Sequence[MemoryView]) -> str | None:
        texts = [m.content for m in members]
        source = sum(len(t) for t in texts)
        return self._ask("compress", COMPRESS_PROMPT.format(items=_numbered(texts)),
                         min(self.settings.llm_max_chars, max(source - 1, 1)), texts,
                         keep_facts=True)

    def describe_cluster(self, members: Sequence[MemoryView], dominant_kind: str) -> str | None:
        texts = [m.content for m in members[:CLUSTER_PROMPT_MEMBERS]]
        prompt = CLUSTER_PROMPT.format(count=len(members), kind=dominant_kind,
                                       items=_numbered(texts))
        # The count is in the prompt: an answer may name it.
        return self._ask("cluster", prompt, self.settings.llm_max_chars,
                         [*texts, str(len(members))], keep_facts=False)

    def compile_block(
        self, block_type: str, facts: Sequence[MemoryView], char_limit: int
    ) -> str | None:
        texts = [m.content for m in facts]
        prompt = BLOCK_PROMPT.format(block=block_type, limit=char_limit, items=_numbered(texts))
        return self._ask(f"block {block_type}", prompt, char_limit, texts, keep_facts=False)
