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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#!/usr/bin/env python3\nimport os\n", "python"),
        ("#!/usr/bin/python3.12 -u\n", "python"),
        ("#!/bin/sh\n", "shell"),
        ("#! /usr/bin/env bash\n", "shell"),
        ("#!/usr/bin/env -S node --no-warnings\n", "javascript"),
        ("#!/usr/bin/env FOO=1 deno run\n", "typescript"),
        ("#!/usr/bin/env\n", None),  # no program
        ("#!/usr/bin/awk -f\n", None),  # an interpreter we do not know
        ("import os\n#!/usr/bin/env python3\n", None),  # only the first line counts
        ("", None),
    ],
)
def test_language_of_shebang(text, expected):
    assert languages.language_of_shebang(text) == expected
