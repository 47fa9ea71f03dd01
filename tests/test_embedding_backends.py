"""The OpenVINO backend gives PyTorch's vectors, faster; whatever fails, PyTorch takes over.

One export per test session, in a temporary cache folder (the suite itself runs on
PyTorch: conftest pins REVERIE_EMBEDDING_BACKEND=torch).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from reverie.engines import embedding
from reverie.engines.embedding import get_embedder
from reverie.engines.torch_embedder import (
    MIN_BATCH_TOKENS,
    TorchEmbedder,
    default_model_path,
    filled,
    load_torch,
    same_length_batches,
)
from reverie.models.errors import EmbeddingError
from reverie.models.settings import EmbeddingBackend, Settings, get_settings
from reverie.models.vectors import DIMENSION

# Ours first: it keeps OpenVINO's telemetry from forking this process (see below).
openvino_embedder = pytest.importorskip("reverie.engines.openvino_embedder")
from reverie.engines.openvino_embedder import (  # noqa: E402
    MANIFEST,
    MIN_COSINE,
    OpenVinoEmbedder,
    cached_model,
    min_cosine,
)

pytestmark = pytest.mark.store_independent("the embedding backends open no store")

LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo3.json"
MODEL = default_model_path()
LOG = "reverie.engines.embedding"


def locomo_sentences(path: Path) -> list[str]:
    """Every sentence of the LoCoMo file: each turn, each observed fact, each question."""
    texts: list[str] = []
    for sample in json.loads(path.read_text(encoding="utf-8")):
        for key, turns in sample["conversation"].items():
            if key.startswith("session_") and isinstance(turns, list):
                texts += [turn["text"] for turn in turns]
        for by_speaker in sample["observation"].values():
            for facts in by_speaker.values():
                texts += [fact for fact, _ in facts]
        texts += [q["question"] for q in sample["qa"]]
    return texts


@pytest.fixture(scope="session")
def ov_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openvino-cache")
    cached_model(MODEL, folder)
    return folder


def test_loading_openvino_neither_forks_nor_phones_home(ov_cache: Path, tmp_path: Path) -> None:
    # A fresh process, without the CI variables that would silence the telemetry anyway,
    # and a home of its own, where the telemetry keeps its client id.
    script = f"""
import os, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
forks = []
os.register_at_fork(before=lambda: forks.append(threading.current_thread().name))
from reverie.engines.openvino_embedder import OpenVinoEmbedder
from reverie.engines.torch_embedder import default_model_path
OpenVinoEmbedder(default_model_path(), 8, Path({str(ov_cache)!r})).encode(["hello"])
time.sleep(3)  # the telemetry sends from a thread of its own, a moment after the import
print(forks, sys.modules.get("openvino_telemetry"))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "JENKINS_URL")}
    done = subprocess.run([sys.executable, "-c", script], env=env | {"HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.split() == ["[]", "None"]
    assert not (tmp_path / "intel").exists()


@pytest.fixture(scope="session")
def reference() -> TorchEmbedder:
    return load_torch(MODEL, 64)


@pytest.fixture(scope="session")
def fast(ov_cache: Path) -> OpenVinoEmbedder:
    return OpenVinoEmbedder(MODEL, 64, ov_cache)


@pytest.mark.skipif(not LOCOMO.exists(), reason=f"LoCoMo dev set not found at {LOCOMO}")
def test_openvino_matches_pytorch_on_the_locomo_dev_set(
    fast: OpenVinoEmbedder, reference: TorchEmbedder
) -> None:
    # Every 4th sentence (over 500, from every conversation): all of them take PyTorch
    # 80 s on two cores. `reverie bench embedding` checks every one (BENCHMARKS.md).
    # Which is faster is `reverie bench embedding`'s to say, as ratios on a quiet
    # machine: timed here it failed on a loaded CI host (20.4 s against 19.4 s).
    texts = locomo_sentences(LOCOMO)[::4]
    assert len(texts) > 500
    got = fast.encode(texts)
    expected = reference.encode(texts)
    cosines = np.sum(got.astype(np.float64) * expected, axis=1)
    worst = int(np.argmin(cosines))
    assert cosines[worst] >= MIN_COSINE, f"sentence {worst}: cosine {cosines[worst]:.5f}"
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_rows_come_back_in_input_order_across_length_buckets(
    fast: OpenVinoEmbedder, reference: TorchEmbedder
) -> None:
    # Lengths interleaved so that sorting by length moves nearly every text, and more
    # texts than one batch so that rows cross buckets.
    texts = [("word " * (1 + (k * 37) % 90)) + f"number {k}" for k in range(150)]
    got = fast.encode(texts)
    expected = reference.encode(texts)
    assert min_cosine(got, expected) >= MIN_COSINE
    # Each row is its own text's, not a neighbour's of similar length.
    assert np.array_equal(np.argmax(got @ expected.T, axis=1), np.arange(len(texts)))


def test_batches_hold_one_token_count_and_keep_ties_in_order() -> None:
    assert same_length_batches([5, 1, 3, 1, 9, 1, 1], 2) == [[1, 3], [5, 6], [2], [0], [4]]
    assert same_length_batches([], 4) == []
    # Filled up to MIN_BATCH_TOKENS with copies of its own rows, never padded.
    short = filled([[7, 8], [7, 9]])
    assert len(short) == MIN_BATCH_TOKENS // 2 and short[:4] == [[7, 8], [7, 9]] * 2
    long = [[1] * MIN_BATCH_TOKENS]
    assert filled(long) == long
    assert len(filled([[1] * (MIN_BATCH_TOKENS - 1)])) == 2
    assert filled([[7, 8]], tokens=0) == [[7, 8]]


def _varied_texts() -> list[str]:
    """Texts of many token counts, a few of each count, and some of one or two tokens
    (PyTorch computes products of very few rows another way)."""
    rng = random.Random(11)
    words = ("rent tea dog walk the user moved office sprint planning honey super "
             "harvest retries backoff seconds Jira Linear café crème brûlée 14 kg").split()
    texts = ["", " ", "ok", "x", "a b", "tea", "the rent", "moved to Linear"]
    texts += [" ".join(rng.choice(words) for _ in range(rng.randint(1, 60)))
              for _ in range(240)]
    texts += [" ".join(f"token{k}" for k in range(600)), texts[20], texts[21]]
    return texts


@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_a_texts_vector_depends_on_its_text_alone(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Alone, all together, in random chunks among random others, and in another
    process: the same bits."""
    model = request.getfixturevalue(backend)
    texts = _varied_texts()
    together = model.encode(texts)
    alone = np.stack([model.encode([t])[0] for t in texts])
    assert np.array_equal(together, alone)
    rng = random.Random(3)
    for _ in range(3):
        order = rng.sample(range(len(texts)), len(texts))
        start = 0
        while start < len(order):
            size = rng.randint(1, 90)
            chunk = order[start : start + size]
            got = model.encode([texts[i] for i in chunk])
            assert np.array_equal(got, together[chunk]), chunk
            start += size
    # Another process, with the same settings: what another worker would compute.
    out = tmp_path / "vectors.npy"
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    probe = (
        "import json, sys, numpy as np\n"
        "from pathlib import Path\n"
        "from reverie.engines.embedding import get_embedder\n"
        "texts = json.loads(Path(sys.argv[1]).read_text())\n"
        "model = get_embedder(batch_size=64, backend=sys.argv[3], cache_dir=sys.argv[4])\n"
        "assert model.backend.value == sys.argv[3]\n"
        "np.save(sys.argv[2], model.encode(texts[::-1])[::-1])\n"
    )
    cache = str(request.getfixturevalue("ov_cache")) if backend == "fast" else str(tmp_path)
    subprocess.run([sys.executable, "-c", probe, str(tmp_path / "texts.json"), str(out),
                    model.backend.value, cache], check=True, timeout=300)
    assert np.array_equal(np.load(out), together)


def test_concurrent_calls_share_batches_and_get_the_same_bits(fast: OpenVinoEmbedder) -> None:
    """A server's calls made at once are embedded together (``_encode_together``), and
    a one-batch call runs beside them in a request of its own: each gets the rows it
    gets alone, in its own order."""
    from concurrent.futures import ThreadPoolExecutor

    texts = _varied_texts()
    calls = [texts[k : k + 16] for k in range(0, len(texts), 16)] + [[t] for t in texts[:12]]
    alone = [fast.encode(c) for c in calls]
    with ThreadPoolExecutor(8) as pool:
        for _ in range(2):
            got = list(pool.map(fast.encode, calls))
            assert all(np.array_equal(a, g) for a, g in zip(alone, got, strict=True))


def test_concurrent_queries_of_one_token_count_share_a_batch_with_the_same_bits(
    fast: OpenVinoEmbedder,
) -> None:
    """A server's one-text calls (recall queries) waiting for a request at once are
    embedded in one batch when they have one token count; each row is its text's own."""
    from concurrent.futures import ThreadPoolExecutor

    queries = [f"where did the team meet on day {k}" for k in range(10, 90)]
    lengths = {len(e.ids) for e in fast._tokenizer.encode_batch(queries)}
    assert len(lengths) == 1
    alone = [fast.encode([q]) for q in queries]
    before = fast.shared_rows
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda q: fast.encode([q]), queries))
    assert all(np.array_equal(a, g) for a, g in zip(alone, got, strict=True))
    assert fast.shared_rows > before


def test_empty_input_gives_no_rows(fast: OpenVinoEmbedder, reference: TorchEmbedder) -> None:
    for model in (fast, reference):
        assert model.encode([]).shape == (0, DIMENSION)
        assert model.encode([""]).shape == (1, DIMENSION)


def test_truncation_matches_past_the_token_limit(
    fast: OpenVinoEmbedder, reference: TorchEmbedder
) -> None:
    long = " ".join(f"token{k}" for k in range(2000))
    texts = [long, long + " a different ending that is cut off", "short"]
    got = fast.encode(texts)
    assert min_cosine(got, reference.encode(texts)) >= MIN_COSINE
    # Both long texts are cut at the same token: the same vector.
    assert float(got[0] @ got[1]) > 0.9999


def test_progress_is_told_every_text_once(fast: OpenVinoEmbedder) -> None:
    counts: list[int] = []
    texts = [f"text {k}" for k in range(130)] + ["a longer text"] * 3
    fast.encode(texts, progress=counts.append)
    assert sum(counts) == len(texts) and max(counts) == 64


def test_a_bad_backend_setting_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EmbeddingError, match="embedding_backend must be one of auto"):
        get_embedder(backend="fastest")
    monkeypatch.setenv("REVERIE_EMBEDDING_BACKEND", "fastest")
    with pytest.raises(ValidationError, match="embedding_backend") as raised:
        get_settings()
    assert "'auto', 'openvino' or 'torch'" in str(raised.value)
    assert Settings(embedding_backend="openvino").embedding_backend is EmbeddingBackend.OPENVINO
    monkeypatch.setenv("REVERIE_EMBEDDING_CACHE_DIR", "")
    with pytest.raises(ValidationError, match="embedding_cache_dir"):
        get_settings()


def test_auto_falls_back_to_pytorch_when_openvino_is_not_installed(
    ov_cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino: ImportError
    monkeypatch.delitem(sys.modules, "reverie.engines.openvino_embedder")
    with caplog.at_level(logging.WARNING, logger=LOG):
        model = embedding.load(MODEL, 64, EmbeddingBackend.AUTO, ov_cache)
    assert isinstance(model, TorchEmbedder)
    (record,) = [r for r in caplog.records if r.name == LOG]
    assert "OpenVINO is not installed" in record.getMessage()


def test_a_corrupted_cache_falls_back_to_pytorch_and_is_removed(
    ov_cache: Path, tmp_path: Path, reference: TorchEmbedder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import shutil

    (export,) = [p for p in ov_cache.iterdir() if (p / MANIFEST).exists()]
    broken = tmp_path / "cache"
    shutil.copytree(export, broken / export.name)
    weights = broken / export.name / "model.bin"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger=LOG):
        model = embedding.load(MODEL, 64, EmbeddingBackend.OPENVINO, broken)
    assert model is reference
    assert any("unusable" in r.getMessage() for r in caplog.records if r.name == LOG)
    assert not (broken / export.name).exists()  # the next load exports afresh
    texts = ["the vectors are PyTorch's own"]
    assert np.array_equal(model.encode(texts), reference.encode(texts))


def test_a_failure_while_embedding_falls_back_to_pytorch(
    ov_cache: Path, reference: TorchEmbedder, caplog: pytest.LogCaptureFixture
) -> None:
    model = OpenVinoEmbedder(MODEL, 64, ov_cache)

    class Broken:
        def start_async(self, inputs: object) -> None:
            raise RuntimeError("device lost")

    model._requests = [Broken()]  # type: ignore[list-item]
    texts = ["a sentence", "another one"]
    with caplog.at_level(logging.WARNING):
        got = model.encode(texts)
    assert np.array_equal(got, reference.encode(texts))
    assert any("PyTorch embeds from now on" in r.getMessage() for r in caplog.records)


def test_an_export_that_fails_its_load_check_is_not_used(
    ov_cache: Path, tmp_path: Path, reference: TorchEmbedder,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The probe check at load runs OpenVINO itself: were it to hand over to PyTorch, it
    would pass on PyTorch's vectors and a broken export would be taken for a good one."""
    import shutil

    (export,) = [p for p in ov_cache.iterdir() if (p / MANIFEST).exists()]
    shutil.copytree(export, tmp_path / export.name)
    real_setup = OpenVinoEmbedder._setup

    class Broken:
        def start_async(self, inputs: object) -> None:
            raise RuntimeError("device lost")

    def broken_setup(self: OpenVinoEmbedder, folder: Path, max_seq_length: int) -> None:
        real_setup(self, folder, max_seq_length)
        self._requests = [Broken()]  # type: ignore[list-item]

    monkeypatch.setattr(OpenVinoEmbedder, "_setup", broken_setup)
    with caplog.at_level(logging.WARNING, logger=LOG):
        model = embedding.load(MODEL, 64, EmbeddingBackend.OPENVINO, tmp_path)
    assert model is reference
    assert any("unusable" in r.getMessage() for r in caplog.records if r.name == LOG)


def test_an_export_that_does_not_match_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(openvino_embedder, "MIN_COSINE", 1.01)  # no export can pass
    with caplog.at_level(logging.WARNING, logger=LOG):
        model = embedding.load(MODEL, 64, EmbeddingBackend.OPENVINO, tmp_path)
    assert isinstance(model, TorchEmbedder)
    assert any("not kept" in r.getMessage() for r in caplog.records if r.name == LOG)
    assert list(tmp_path.iterdir()) == []


def test_a_second_load_reuses_the_export(
    ov_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (export,) = [p for p in ov_cache.iterdir() if (p / MANIFEST).exists()]
    before = {p.name: p.stat().st_mtime_ns for p in export.iterdir()}

    def no_export(*args: object) -> None:
        raise AssertionError("exported again")

    monkeypatch.setattr(openvino_embedder, "export", no_export)
    monkeypatch.setattr(embedding, "load_torch", no_export)
    model = OpenVinoEmbedder(MODEL, 64, ov_cache)
    assert model.encode(["still here"]).shape == (1, DIMENSION)
    assert {p.name: p.stat().st_mtime_ns for p in export.iterdir()} == before


def test_two_exports_racing_leave_one_complete_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second export finishes while the first is still exporting: the first's rename
    then finds the folder taken, and uses it."""
    real_export = openvino_embedder.export
    raced: list[Path] = []

    def export_while_another_finishes(path: Path, folder: Path, reference: TorchEmbedder) -> None:
        if not raced:
            raced.append(folder)
            raced.append(cached_model(path, tmp_path))  # the other process, first to finish
        real_export(path, folder, reference)

    monkeypatch.setattr(openvino_embedder, "export", export_while_another_finishes)
    first = cached_model(MODEL, tmp_path)
    assert raced[1] == first and raced[0] != first
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no half-built folders
    assert OpenVinoEmbedder(MODEL, 64, tmp_path).encode(["ok"]).shape == (1, DIMENSION)


def test_threads_of_one_process_export_once_between_them(
    ov_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.onnx keeps its state in globals: two threads exporting at once failed, and
    a server's first concurrent recalls fell back to PyTorch for good. The export here
    copies the session's (the real one takes seconds); the check after it is real."""
    (done,) = [p for p in ov_cache.iterdir() if (p / MANIFEST).exists()]
    running, calls, most = [0], [0], [0]
    lock = threading.Lock()

    def copying_export(path: Path, folder: Path, reference: TorchEmbedder) -> None:
        with lock:
            running[0] += 1
            calls[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)  # long enough for every thread to arrive meanwhile
        for name in ("model.xml", "model.bin", "tokenizer.json"):
            shutil.copyfile(done / name, folder / name)
        with lock:
            running[0] -= 1

    monkeypatch.setattr(openvino_embedder, "export", copying_export)
    start = threading.Barrier(4)

    def first_use() -> Path:
        start.wait()
        return cached_model(MODEL, tmp_path)

    with ThreadPoolExecutor(4) as pool:
        folders = set(pool.map(lambda _: first_use(), range(4)))
    assert (calls[0], most[0]) == (1, 1)
    assert len(folders) == 1 and [p.name for p in tmp_path.iterdir()] == [folders.pop().name]


INGEST_WITHOUT_TORCH = """
import sys
import threading
from reverie.engines.embedding import embedder_for
from reverie.models.ingest import ingest
from reverie.models.store import Store
store = Store(sys.argv[1])
embedder = embedder_for(store.settings)
report = ingest(store, [{"content": f"sentence number {k}", "profile": "p"} for k in range(50)],
                embedder)
assert report.stored == 50, report
print(type(embedder).__name__, "torch" in sys.modules, "sentence_transformers" in sys.modules)
"""


def test_an_ingest_on_openvino_never_imports_torch(ov_cache: Path, tmp_path: Path) -> None:
    env = {**os.environ, "REVERIE_EMBEDDING_BACKEND": "openvino",
           "REVERIE_EMBEDDING_CACHE_DIR": str(ov_cache), "REVERIE_EMIT_EVENTS": "false"}
    done = subprocess.run(
        [sys.executable, "-c", INGEST_WITHOUT_TORCH, f"sqlite:///{tmp_path / 'p.db'}"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["OpenVinoEmbedder", "False", "False"], done.stderr[-3000:]


def test_bench_embedding_compares_both_backends_from_the_cli(
    ov_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from reverie.benchmarks.embedding import summaries
    from reverie.deployments.cli import main

    assert summaries(["a", "b", "c", "d", "e", "f"]) == ["Summary: a | b | c | d | e"]
    monkeypatch.setenv("REVERIE_EMBEDDING_CACHE_DIR", str(ov_cache))
    out = tmp_path / "embed.json"
    assert main(["bench", "embedding", "--sentences", "32", "--json", str(out)]) == 0
    rows = {r["workload"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"short synthetic sentences", "5-memory summaries of synthetic sentences",
                         "ingest + embed (models.ingest)"}
    assert rows["short synthetic sentences"]["min_cosine"] >= MIN_COSINE
    assert rows["ingest + embed (models.ingest)"]["n"] == 32
    assert "| short synthetic sentences | 32 |" in capsys.readouterr().out
    assert main(["bench", "embedding", "--locomo", str(tmp_path / "absent.json")]) != 0


EXPORT = """
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from reverie.engines.torch_embedder import default_model_path
from reverie.engines.openvino_embedder import cached_model
print(cached_model(default_model_path(), Path(sys.argv[1])))
"""


@pytest.mark.slow
def test_two_processes_exporting_at_once_agree_on_one_export(tmp_path: Path) -> None:
    racers = [subprocess.Popen([sys.executable, "-c", EXPORT, str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(2)]
    results = [racer.communicate(timeout=600) for racer in racers]
    assert [r.returncode for r in racers] == [0, 0], [err[-2000:] for _, err in results]
    folders = {out.strip() for out, _ in results}
    assert len(folders) == 1
    assert [p.name for p in tmp_path.iterdir()] == [Path(folders.pop()).name]
