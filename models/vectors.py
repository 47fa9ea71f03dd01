"""Plain vector helpers: the stored vectors' shape, their bytes, and checking a vector a
caller supplies (or a backup carries). No model here: engines/embedding.py loads one."""

from __future__ import annotations

from numbers import Real

import numpy as np

# The name stored beside vectors of the packaged model, whichever backend computed them:
# both give the same vectors (cosine >= 0.999, engines/openvino_embedder.py checks it).
MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSION = 384
UNIT_TOLERANCE = 1e-6


def to_blob(vector: np.ndarray) -> bytes:
    return np.ascontiguousarray(vector, dtype=np.float32).tobytes()


def from_blobs(blobs: list[bytes], dimension: int = DIMENSION) -> np.ndarray:
    """Stack stored vectors into one (n, dimension) float32 matrix."""
    if not blobs:
        return np.zeros((0, dimension), dtype=np.float32)
    # Joined into a bytearray: numpy reads it in place and writable, where bytes would
    # need a copy (150 MB at 100k rows).
    return np.frombuffer(bytearray().join(blobs), dtype=np.float32).reshape(len(blobs), -1)


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


def check_stored(blob: bytes, dimension: int = DIMENSION) -> np.ndarray:
    """Check a vector in the form the store keeps (float32 bytes, unit length), as a
    backup carries it: what ingest would have stored, or ValueError saying why not.

    A blob of the wrong size would make every later read of the profile's vectors fail
    (they are stacked into one matrix), and a vector that is not unit would skew every
    cosine it takes part in: both are refused, never repaired.
    """
    if len(blob) != dimension * 4:
        raise ValueError(f"embedding is {len(blob)} bytes, not {dimension} float32 numbers "
                         f"({dimension * 4} bytes)")
    vector = np.frombuffer(blob, dtype=np.float32)
    # Ingest's own check: refuses NaN, infinity and all zeros, and returns a vector
    # within UNIT_TOLERANCE of unit length exactly as given, rescaling any other.
    if not np.array_equal(normalise(vector, dimension), vector):
        raise ValueError("embedding is not of unit length (as every stored vector is)")
    return vector
