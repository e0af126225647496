"""Unit tests of server/languages.py: which grammar a document gets."""

from __future__ import annotations

import pytest

from dfim.server import languages


@pytest.mark.parametrize(
    ("language_id", "uri", "expected"),
    [
        ("python", "", "python"),
        ("typescriptreact", "", "tsx"),
        ("", "file:///x/y.rs", "rust"),
        ("plaintext", "file:///x/y.hpp", "cpp"),
        ("markdown", "file:///x/README.md", None),
    ],
)
def test_language_for(language_id, uri, expected):
    assert languages.language_for(language_id, uri) == expected
