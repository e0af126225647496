"""The corpus builder's path filter (scripts/corpus/corpus_lib.py, run where the registries are reachable)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "scripts" / "corpus" / "corpus_lib.py"


@pytest.fixture(scope="module")
def corpus_lib():
    spec = importlib.util.spec_from_file_location("corpus_lib", LIB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["corpus_lib"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "path",
    [
        "pip-24/src/pip/_vendor/requests/api.py",
        "tool-1.0/.tox/py312/lib/python3.12/site-packages/six.py",
        "app-2.0/venv/lib/helpers.py",
        "pkg-3/node_modules/left-pad/index.js",
        "lib-1/third_party/zlib/inflate.c",
    ],
)
def test_vendored_and_installed_copies_are_dropped(corpus_lib, path):
    assert corpus_lib.path_reject(path) == "path:vendored_or_generated"


def test_a_project_own_source_is_kept(corpus_lib):
    assert corpus_lib.path_reject("requests-2.32/src/requests/sessions.py") is None
    assert corpus_lib.path_reject("event-1.0/src/venue.py") is None  # a name that contains "venv"-like text
