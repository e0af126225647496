"""Near-duplicate detection: MinHash signatures over token 5-grams, banded LSH, Jaccard >= 0.85.

The same file copied into several projects with a changed licence header, a bumped version string or
a reformatted line is still the same text to a model: trained on many times, memorised, and a leak of
held-out code when one copy is evaluated. Exact and whitespace-normalised hashes miss these.

Signatures are computed in the worker processes from the token ids the builder has already made
(no second pass over the text); the index lives in the main process, which sees files in order, so
the first copy is kept as with exact dedup.
"""

from __future__ import annotations

import numpy as np

NUM_PERM = 128
BANDS, ROWS = 16, 8  # 16 x 8 = 128; candidates from Jaccard ~0.7 up, then checked on the whole signature
SHINGLE = 5
THRESHOLD = 0.85
_rng = np.random.default_rng(0x5EED)
# Multiply-shift hashing: (a * x + b) mod 2^64, top 32 bits; a odd. One (a, b) pair per permutation.
_A = (_rng.integers(1, 2**63, NUM_PERM, dtype=np.uint64) << np.uint64(1)) | np.uint64(1)
_B = _rng.integers(0, 2**63, NUM_PERM, dtype=np.uint64)
_POW = np.array([0x9E3779B97F4A7C15**k % 2**64 for k in range(SHINGLE)], dtype=np.uint64)


def signature(ids: np.ndarray) -> np.ndarray | None:
    """uint32[NUM_PERM] MinHash of the set of token 5-grams; None for files shorter than one 5-gram."""
    ids = np.asarray(ids, dtype=np.uint64)
    n = len(ids) - SHINGLE + 1
    if n <= 0:
        return None
    with np.errstate(over="ignore"):
        shingles = np.zeros(n, dtype=np.uint64)
        for k in range(SHINGLE):
            shingles += (ids[k : k + n] + np.uint64(1)) * _POW[k]
        shingles = np.unique(shingles)
        out = np.full(NUM_PERM, np.iinfo(np.uint32).max, dtype=np.uint32)
        for start in range(0, len(shingles), 4096):  # bounded memory for big files
            block = shingles[start : start + 4096, None] * _A[None, :] + _B[None, :]
            out = np.minimum(out, (block >> np.uint64(32)).astype(np.uint32).min(axis=0))
    return out


class NearDupIndex:
    """Files added in order; `add` says whether an earlier file is a near duplicate (and keeps the new
    one in the index only when it is not, so a chain of small edits cannot walk far from the first)."""

    def __init__(self, threshold: float = THRESHOLD) -> None:
        self.threshold = threshold
        self.bands: list[dict[bytes, int]] = [{} for _ in range(BANDS)]
        self.signatures: list[np.ndarray] = []

    def add(self, sig: np.ndarray | None) -> bool:
        """True when `sig` is within the threshold of a file already added (then it is not added)."""
        if sig is None:
            return False
        keys = [sig[b * ROWS : (b + 1) * ROWS].tobytes() for b in range(BANDS)]
        checked: set[int] = set()
        for band, key in zip(self.bands, keys, strict=True):
            other = band.get(key)
            if other is not None and other not in checked:
                checked.add(other)
                if float(np.mean(self.signatures[other] == sig)) >= self.threshold:
                    return True
        index = len(self.signatures)
        self.signatures.append(sig)
        for band, key in zip(self.bands, keys, strict=True):
            band.setdefault(key, index)
        return False


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard similarity of two files' token 5-gram sets (for tests and spot checks)."""

    def grams(ids: np.ndarray) -> set[tuple[int, ...]]:
        return {tuple(ids[i : i + SHINGLE].tolist()) for i in range(len(ids) - SHINGLE + 1)}

    x, y = grams(np.asarray(a)), grams(np.asarray(b))
    return len(x & y) / max(1, len(x | y))
