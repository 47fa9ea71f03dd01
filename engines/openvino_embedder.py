"""The sentence model on OpenVINO: exported once per machine from the packaged
sentence-transformers model, then loaded without torch.

The export is the transformer with the model's own mean pooling and L2 normalisation
in one graph, so a row is what ``SentenceTransformer.encode(normalize_embeddings=True)``
gives, to cosine >= 0.999 (bf16 arithmetic where the CPU has it). It is built in a
temporary folder beside the cache and renamed into place only after its vectors
matched PyTorch's on fixed probe sentences: a reader never sees half an export, and of
two processes exporting at once one rename wins and the other uses the winner's.

Texts are tokenised with the model's own ``tokenizer.json`` (the Rust ``tokenizers``,
no torch) and batched with texts of the same token count, never padded, so that a
text's vector does not depend on the others (engines/torch_embedder.py says why); rows
come back in input order.
The model is compiled for throughput: several batches are in flight at once, one per
OpenVINO stream.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from reverie.engines.group_commit import GroupAborted, GroupCommit
from reverie.engines.torch_embedder import (
    Progress,
    TorchEmbedder,
    batches,
    load_torch,
    model_name,
    same_length_batches,
)
from reverie.models.errors import EmbeddingError
from reverie.models.settings import EmbeddingBackend

# OpenVINO sends usage telemetry on import unless ~/intel/openvino_telemetry says no:
# its package forks the whole process from a thread of its own to reach Google
# Analytics. A memory store's process must not phone home, and a fork while another
# thread is inside an OpenBLAS call leaves that call waiting forever for BLAS threads
# the fork shut down (a full consolidation hung in compression's planning, with the
# model loading on the embedding thread). Without the package, OpenVINO falls back to
# its own stub, which sends nothing. A process that imported it already keeps it.
# Set here, where importing this module is what loads OpenVINO, and before it does.
sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]  # None: not importable

import openvino as ov  # noqa: E402

log = logging.getLogger(__name__)

# Bump when the exported graph or the manifest changes: older exports are then ignored.
EXPORT_FORMAT = 1
MIN_COSINE = 0.999
MANIFEST = "manifest.json"
# The layout the export reproduces; any other model stays on PyTorch.
LAYOUT = [
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Normalize",
]
# Fixed sentences an export must reproduce before it is kept, and a cached one each time
# it loads (a truncated or foreign file fails here, not on the user's texts): short and
# long, punctuation, accents, blank, and one past the model's token limit (truncation).
PROBES = (
    "",
    "   ",
    "ok",
    "The deploy script needs the staging credentials before noon.",
    "She prefers tea over coffee, and she's allergic to peanuts!",
    "Réunion à 14h : café, thé et crème brûlée pour l'équipe.",
    "Use `pytest -x -q` for quick runs; the CI runs the whole suite on PostgreSQL too.",
    "We moved from Ubuntu 20.04 to Debian 12 in March 2025 because of the glibc bug.",
    " ".join(f"step {i} checks the queue, retries twice and logs the outcome." for i in range(60)),
)
# One export at a time in a process: torch.onnx keeps its state in globals, and a
# second thread's export failed ("GLOBALS.in_onnx_export must be True"); a fresh
# server whose first 8 recalls came at once kept PyTorch for good, at several times
# the CPU per recall. Reentrant: an export may look the folder up again (the racing test).
_exporting = threading.RLock()


def precision(core: ov.Core) -> str:
    """bf16 where the CPU computes it natively (the model is then ~2x faster again and
    still within the cosine bound), fp32 elsewhere."""
    capabilities = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    return "bf16" if "BF16" in capabilities else "f32"


def fingerprint(path: Path) -> str:
    """What an export depends on: the model's files (names, sizes, modification times),
    the OpenVINO version and the export format. Any change gives a fresh export."""
    digest = hashlib.sha256(f"{EXPORT_FORMAT}|{ov.get_version()}".encode())
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        stat = file.stat()
        digest.update(f"|{file.relative_to(path)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def cache_folder(path: Path, cache_dir: Path) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_name(path))
    return cache_dir / f"{safe}-{fingerprint(path)}"


def check_layout(path: Path) -> None:
    """Raise EmbeddingError unless the model is transformer, mean pooling, normalise."""
    try:
        modules = json.loads((path / "modules.json").read_text(encoding="utf-8"))
        pooling = json.loads((path / "1_Pooling" / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EmbeddingError(f"cannot read the model's layout in {path}: {exc}") from None
    types = [m.get("type") for m in modules]
    modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode") and v)
    if types != LAYOUT or modes != ["pooling_mode_mean_tokens"]:
        raise EmbeddingError(
            f"the model in {path} is not transformer + mean pooling + normalise "
            "(the layout the OpenVINO export reproduces)")
    if not (path / "tokenizer.json").exists():
        raise EmbeddingError(f"the model in {path} has no tokenizer.json")


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Smallest row-wise cosine of two matrices of unit rows."""
    return float(np.min(np.sum(a.astype(np.float64) * b.astype(np.float64), axis=1)))


def export(path: Path, folder: Path, reference: TorchEmbedder) -> None:
    """Write ``folder``/model.xml: the reference's transformer, mean pooling and L2
    normalisation as one OpenVINO graph with dynamic batch and length."""
    import torch

    transformer = reference.model[0].auto_model

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.transformer(
                input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            # sentence-transformers' mean pooling: the clamp keeps an all-masked row finite.
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    # Traced with a padded row: traced on a full mask, transformers may leave the mask
    # out of the graph, and padded batches would then attend to their padding.
    ids = torch.tensor([[101, 2023, 2003, 1037, 102], [101, 7592, 102, 0, 0]])
    onnx_file = folder / "model.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on shapes it keeps dynamic
        torch.onnx.export(
            Pooled().eval(), (ids, (ids != 0).long()), str(onnx_file),
            input_names=["input_ids", "attention_mask"], output_names=["embedding"],
            dynamic_axes={"input_ids": {0: "batch", 1: "tokens"},
                          "attention_mask": {0: "batch", 1: "tokens"},
                          "embedding": {0: "batch"}},
            opset_version=17, dynamo=False,
        )
    # fp32 weights on disk: the precision is chosen per CPU when compiling.
    ov.save_model(ov.Core().read_model(str(onnx_file)), str(folder / "model.xml"),
                  compress_to_fp16=False)
    onnx_file.unlink()
    # The export's own tokenizer: the cache folder is all a later load reads.
    shutil.copyfile(path / "tokenizer.json", folder / "tokenizer.json")


def cached_model(
    path: Path, cache_dir: Path, reference: Callable[[], TorchEmbedder] | None = None
) -> Path:
    """The folder of the checked export of ``path`` under ``cache_dir``, exporting it
    first if no process has yet (``reference``: the PyTorch model to export from and
    check against, loaded only then)."""
    final = cache_folder(path, cache_dir)
    if (final / MANIFEST).exists():
        return final
    with _exporting:
        # Another thread of this process may have exported it while this one waited.
        if (final / MANIFEST).exists():
            return final
        return _export_checked(path, cache_dir, final, reference)


def _export_checked(path: Path, cache_dir: Path, final: Path,
                    reference: Callable[[], TorchEmbedder] | None) -> Path:
    check_layout(path)
    torch_model = (reference or (lambda: load_torch(path, 64)))()
    cache_dir.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=cache_dir))
    try:
        log.info("exporting the embedding model to OpenVINO in %s", final)
        export(path, building, torch_model)
        expected = torch_model.encode(list(PROBES))
        got = OpenVinoEmbedder.compiled(building, torch_model.model.max_seq_length)._encode(
            list(PROBES), False)
        worst = min_cosine(got, expected)
        if worst < MIN_COSINE:
            raise EmbeddingError(
                f"the OpenVINO export gives cosine {worst:.5f} to PyTorch on the probe "
                f"sentences, below {MIN_COSINE}: not kept")
        # The manifest is written last: a folder with one is a complete, checked export.
        (building / MANIFEST).write_text(json.dumps({
            "format": EXPORT_FORMAT,
            "openvino": ov.get_version(),
            "max_seq_length": int(torch_model.model.max_seq_length),
            "dimension": int(torch_model.dimension),
            "probe_cosine": worst,
            "probes": expected.astype(float).round(7).tolist(),
        }), encoding="utf-8")
        try:
            os.rename(building, final)
        except OSError:
            # Another process renamed its export first: use that one.
            if not (final / MANIFEST).exists():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return final


class OpenVinoEmbedder:
    """The exported model compiled for this CPU; same rows as the PyTorch model."""

    backend = EmbeddingBackend.OPENVINO

    def __init__(self, path: Path, batch_size: int, cache_dir: Path) -> None:
        self.name = model_name(path)
        self.batch_size = batch_size
        self._path = path
        self._fallback: TorchEmbedder | None = None
        folder = cached_model(path, cache_dir)
        try:
            manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
            self._setup(folder, int(manifest["max_seq_length"]))
            # _encode, not encode: a failure here must not hand over to PyTorch unnoticed.
            worst = min_cosine(self._encode(list(PROBES), False), np.asarray(manifest["probes"]))
        except Exception as exc:
            # Unusable (a truncated file, another CPU's numbers): the next load exports
            # afresh; this one falls back to PyTorch.
            shutil.rmtree(folder, ignore_errors=True)
            raise EmbeddingError(f"the OpenVINO export in {folder} is unusable and was "
                                 f"removed ({type(exc).__name__}: {exc})") from None
        if worst < MIN_COSINE:
            shutil.rmtree(folder, ignore_errors=True)
            raise EmbeddingError(f"the OpenVINO export in {folder} gives cosine {worst:.5f} "
                                 f"on the probe sentences, below {MIN_COSINE}; removed")

    @classmethod
    def compiled(cls, folder: Path, max_seq_length: int, batch_size: int = 64) -> OpenVinoEmbedder:
        """An embedder of the export in ``folder``, without the cache's checks (the
        export's own check uses it before there is a manifest)."""
        embedder = cls.__new__(cls)
        embedder.name = folder.name
        embedder.batch_size = batch_size
        embedder._path = folder
        embedder._fallback = None
        embedder._setup(folder, max_seq_length)
        return embedder

    def _setup(self, folder: Path, max_seq_length: int) -> None:
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_seq_length)
        core = ov.Core()
        self.precision = precision(core)
        compiled = core.compile_model(str(folder / "model.xml"), "CPU", {
            "INFERENCE_PRECISION_HINT": self.precision,
            # Streams of one or a few threads, each batch in one of them, several in
            # flight: on two shared cores 1.4x the texts per second of one request
            # over both cores, whose threads wait for each other at every layer.
            "PERFORMANCE_HINT": "THROUGHPUT",
        })
        count = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        self._requests = [compiled.create_infer_request() for _ in range(max(1, count))]
        self.dimension = int(compiled.output(0).get_partial_shape()[1].get_length())
        # A call of one batch (a recall's query) takes one request, so that a server's
        # concurrent recalls run in as many streams at once; calls of one token count
        # waiting meanwhile for a request go in its batch (``_encode_one``). A call of
        # several batches takes every request, one call at a time (``_lock``).
        self._batches: GroupCommit[list[list[int]], np.ndarray] = GroupCommit(
            self._one_batch, slots=len(self._requests), limit=self.batch_size)
        # The texts of calls of several batches waiting meanwhile (``_encode_together``).
        self._together: GroupCommit[list[list[int]], np.ndarray] = GroupCommit(
            self._all_batches)
        self.shared_rows = 0  # rows embedded in another call's batch (for the tests)
        self._lock = threading.Lock()

    def encode(self, texts: list[str], progress: Progress = False) -> np.ndarray:
        if self._fallback is None:
            try:
                return self._encode(texts, progress)
            except GroupAborted:
                raise  # another thread's interrupt, not a fault of OpenVINO
            except Exception as exc:  # noqa: BLE001 - the slow path still works
                # The type only: a message could quote what was being embedded.
                log.warning("OpenVINO failed to embed (%s): PyTorch embeds from now on",
                            type(exc).__name__)
                self._fallback = load_torch(self._path, self.batch_size)
        return self._fallback.encode(texts, progress)

    def _take(self) -> int:
        return self._batches.take_slot()

    def _give(self, k: int) -> None:
        self._batches.give_slot(k)

    def _encode_one(self, tokens: list[list[int]], bucket: list[int], out: np.ndarray,
                    progress: Progress) -> np.ndarray:
        """One batch in one free request: concurrent callers run side by side. Calls of
        one token count that wait meanwhile for a request go in one batch, run by the
        first of them to get one: one text alone cost 2.8 ms of CPU, in a batch of 4
        1.7 ms. A row does not depend on its batch (``same_length_batches``), so the
        bits are those of the call alone."""
        mine = [tokens[i] for i in bucket]
        try:
            rows = self._batches.submit(mine, key=len(mine[0]), size=len(mine))
        except GroupAborted:
            raise
        except Exception as exc:
            raise EmbeddingError(f"embedding failed ({type(exc).__name__})") from exc
        out[bucket] = rows
        if callable(progress):
            progress(len(bucket))
        return out

    def _one_batch(self, k: int, jobs: list[list[list[int]]]) -> list[np.ndarray]:
        """``jobs``' rows (each a list of token lists of one length) in one batch of
        request ``k``."""
        request = self._requests[k]
        ids = np.array([t for j in jobs for t in j], dtype=np.int64)
        request.start_async({"input_ids": ids, "attention_mask": np.ones_like(ids)})
        request.wait()
        rows = request.get_output_tensor(0).data[: len(ids)]
        answers, at = [], 0
        for j in jobs:
            answers.append(rows[at:at + len(j)].copy())
            at += len(j)
        self.shared_rows += len(ids) - len(jobs[0])
        return answers

    def _encode(self, texts: list[str], progress: Progress) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        tokens = [e.ids for e in self._tokenizer.encode_batch(texts)]
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        buckets = same_length_batches([len(t) for t in tokens], self.batch_size)
        if len(buckets) == 1 and progress is not True:
            return self._encode_one(tokens, buckets[0], out, progress)
        if not progress:
            return self._encode_together(tokens, out)
        chosen, done = batches(buckets, progress)
        with self._lock:
            self._pipelined(tokens, out, buckets, chosen, done)
        return out

    def _encode_together(self, tokens: list[list[int]], out: np.ndarray) -> np.ndarray:
        """The texts of every call waiting meanwhile, embedded as one: a server's
        calls of 16 texts each made 5 batches of about 3, a third as fast per text as
        ingest's batches of 64. A text's row does not depend on its batch (see
        ``same_length_batches``), so sharing batches with other calls changes no bit."""
        try:
            out[:] = self._together.submit(tokens)
        except GroupAborted:
            raise
        except Exception as exc:
            raise EmbeddingError(f"embedding failed ({type(exc).__name__})") from exc
        return out

    def _all_batches(self, _slot: int, jobs: list[list[list[int]]]) -> list[np.ndarray]:
        every = [t for j in jobs for t in j]
        rows = np.empty((len(every), self.dimension), dtype=np.float32)
        buckets = same_length_batches([len(t) for t in every], self.batch_size)
        with self._lock:
            self._pipelined(every, rows, buckets, buckets, None)
        answers, at = [], 0
        for j in jobs:
            answers.append(rows[at:at + len(j)])
            at += len(j)
        return answers

    def _pipelined(self, tokens: list[list[int]], out: np.ndarray, buckets: list[list[int]],
                   chosen: Iterable[list[int]], done: Callable[[int], None] | None) -> None:
        """Every bucket through every request, several in flight; the caller holds
        ``_lock``."""
        # Request k takes batches k, k + n, ...: before it starts its next batch, its
        # last one is waited for and copied out.
        running: list[list[int] | None] = [None] * len(self._requests)

        def collect(k: int, requests: list[ov.InferRequest]) -> None:
            bucket = running[k]
            if bucket is not None:
                requests[k].wait()
                out[bucket] = requests[k].get_output_tensor(0).data[: len(bucket)]
                running[k] = None
                if done is not None:
                    done(len(bucket))

        held = [self._take() for _ in self._requests]
        requests = [self._requests[k] for k in held]
        try:
            n = len(requests)
            for number, bucket in enumerate(chosen):
                collect(number % n, requests)
                ids = np.array([tokens[i] for i in bucket], dtype=np.int64)
                requests[number % n].start_async(
                    {"input_ids": ids, "attention_mask": np.ones_like(ids)})
                running[number % n] = bucket
            # Oldest first, so that progress hears of the batches in order.
            for later in range(1, n + 1):
                collect((len(buckets) - 1 + later) % n, requests)
        finally:
            # After a failure, no request may still be running into the next call.
            for k, pending in enumerate(running):
                if pending is not None:
                    requests[k].wait()
            for k in held:
                self._give(k)
