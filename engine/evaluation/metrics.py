"""Scores shared by every evaluation (DESIGN §6): exact match, edit similarity, pass@k, percentiles."""

from __future__ import annotations

import math
from collections.abc import Sequence


def exact_match(prediction: str, reference: str) -> bool:
    """Equal after strip(): leading indentation and the trailing newline do not count."""
    return prediction.strip() == reference.strip()


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert, delete, substitute; unit costs) by the two-row dynamic programme."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def edit_similarity(prediction: str, reference: str) -> float:
    """Normalized Levenshtein ratio in [0, 100]: 100 * (1 - distance / max length), on strip()ped strings.

    100 means identical, 0 means nothing in common (or one side empty and the other not).
    """
    a, b = prediction.strip(), reference.strip()
    longest = max(len(a), len(b))
    if longest == 0:
        return 100.0
    return 100.0 * (1.0 - levenshtein(a, b) / longest)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021) from n samples of which c pass: 1 - C(n-c, k) / C(n, k).

    With one sample per problem (n = k = 1) this is simply 1.0 if it passed, else 0.0.
    """
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default)."""
    if not values:
        return math.nan
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan
