"""Scores of DESIGN §6: exact match, edit similarity, pass@k, percentiles."""

import math

import pytest

from dfim.engine.evaluation import metrics


def test_exact_match_ignores_surrounding_whitespace_only():
    assert metrics.exact_match("    return x\n", "return x")
    assert metrics.exact_match("\treturn x  ", "    return x\n")
    assert not metrics.exact_match("return  x", "return x")
    assert not metrics.exact_match("return y", "return x")


def test_levenshtein_known_values():
    assert metrics.levenshtein("kitten", "sitting") == 3
    assert metrics.levenshtein("", "abc") == 3
    assert metrics.levenshtein("abc", "") == 3
    assert metrics.levenshtein("abc", "abc") == 0
    assert metrics.levenshtein("flaw", "lawn") == 2
    assert metrics.levenshtein("ab", "ba") == 2  # no transpositions


def test_levenshtein_is_symmetric():
    pairs = [("for i in x:", "for j in y:"), ("", "x"), ("return a", "retur")]
    for a, b in pairs:
        assert metrics.levenshtein(a, b) == metrics.levenshtein(b, a)


def test_edit_similarity_range_and_values():
    assert metrics.edit_similarity("    x = 1\n", "x = 1") == 100.0
    assert metrics.edit_similarity("", "") == 100.0
    assert metrics.edit_similarity("", "abc") == 0.0
    assert metrics.edit_similarity("abc", "xyz") == 0.0
    assert metrics.edit_similarity("kitten", "sitting") == pytest.approx(100 * (1 - 3 / 7))
    value = metrics.edit_similarity("return a + b", "return a - b")
    assert 0.0 < value < 100.0


def test_pass_at_k():
    assert metrics.pass_at_k(1, 1, 1) == 1.0
    assert metrics.pass_at_k(1, 0, 1) == 0.0
    assert metrics.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert metrics.pass_at_k(10, 0, 5) == 0.0
    assert metrics.pass_at_k(10, 8, 5) == 1.0  # fewer than k failures: some draw of k always passes
    assert metrics.pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)
    with pytest.raises(ValueError):
        metrics.pass_at_k(3, 4, 1)


def test_percentile_interpolates_like_numpy():
    values = [4.0, 1.0, 3.0, 2.0]
    assert metrics.percentile(values, 0) == 1.0
    assert metrics.percentile(values, 100) == 4.0
    assert metrics.percentile(values, 50) == 2.5
    assert metrics.percentile(values, 95) == pytest.approx(3.85)
    assert metrics.percentile([7.0], 95) == 7.0
    assert math.isnan(metrics.percentile([], 50))
    with pytest.raises(ValueError):
        metrics.percentile(values, 101)


def test_mean():
    assert metrics.mean([1, 2, 3]) == 2
    assert math.isnan(metrics.mean([]))
