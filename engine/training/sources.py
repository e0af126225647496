"""Where training text comes from besides `.py` folders: corpus shards and C/C++ header folders.

Corpus shards (`train-NN.jsonl.xz`, built from package registries on a development machine and
carried to the GPU machine) hold one JSON object a line: `text`, `path`, `lang`, `license`, `source`.
Header folders (`/usr/include`, torch's `include/`) are read where the data is built; each file's
licence is found from the package that installed it, and a file whose licence cannot be found is
left out rather than guessed.

Only permissive licences are trained on (`is_permissive`): the model's output must be free to use.
"""

from __future__ import annotations

import json
import lzma
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

# SPDX ids (lower-case) and common spellings of licences that put no obligation on derived code beyond
# attribution. Weak copyleft (LGPL, MPL, EPL) is left out on purpose: those terms follow the file.
PERMISSIVE = {
    "mit",
    "mit-0",
    "expat",
    "x11",
    "apache-2.0",
    "apache 2.0",
    "apache",
    "apache software license",
    "bsd",
    "bsd license",
    "0bsd",
    "bsd-2-clause",
    "bsd-3-clause",
    "bsd-3-clause-clear",
    "bsd-4-clause",
    "isc",
    "isc license (iscl)",
    "zlib",
    "zlib/libpng",
    "libpng",
    "bsl-1.0",
    "boost",
    "boost software license 1.0 (bsl-1.0)",
    "unlicense",
    "the unlicense (unlicense)",
    "cc0-1.0",
    "cc0",
    "public-domain",
    "public domain",
    "psf-2.0",
    "python-2.0",
    "psf",
    "python software foundation license",
    "mit license",
    "mit-cmu",
    "ncsa",
    "wtfpl",
    "curl",
    "blueoak-1.0.0",
    "upl-1.0",
    "apache software",
    "apache license 2.0",
    "apache license, version 2.0",
    "cnri-python",
}
# Suffixes that mark an exception or variant of a permissive licence, not another licence.
_LICENSE_NOISE = re.compile(r"\s*(\+|-or-later|-only|\s+with\s+llvm-exception|\s+with\s+.*exception)$", re.I)

HEADER_SUFFIXES = {".h": "c", ".hh": "cpp", ".hpp": "cpp", ".hxx": "cpp", ".cuh": "cpp", ".inl": "cpp"}
# A `.h` file is C++ when it uses what C has not (these appear in nearly every C++ header).
_CPP_MARKERS = re.compile(
    r"^\s*(namespace\s+\w|template\s*<|class\s+\w+[^;]*\{|#include\s*<[a-z_]+>\s*$)", re.M
)


def is_permissive(license_expr: str) -> bool:
    """A licence expression (SPDX `A OR B`, `A AND B`, or a classifier name) allows training and reuse.

    `OR` offers a choice, so one permissive alternative is enough; `AND` needs every part."""
    expr = license_expr.strip().strip("()")
    if not expr:
        return False
    for alternative in re.split(r"\s+or\s+|\s*/\s*(?=[a-z])|;\s*", expr, flags=re.I):
        parts = re.split(r"\s+and\s+|\s*,\s*", alternative.strip().strip("()"), flags=re.I)
        if parts and all(_normalise(p) in PERMISSIVE for p in parts):
            return True
    return False


def _normalise(name: str) -> str:
    """`Apache 2.0 License`, `ISC License (ISCL)`, `MIT+` -> the spelling PERMISSIVE lists."""
    name = re.sub(r"\([^)]*\)?", "", name).strip().strip("()")  # an outer strip may eat its ")"
    name = _LICENSE_NOISE.sub("", name).lower().strip()
    return re.sub(r"\s+license$", "", name).strip()


# A folder of the user's own code (`dfim data --roots DIR`) is read in every language the server serves; the
# standard library and site-packages stay .py only (their other files are mostly generated or vendored).
SOURCE_SUFFIXES = {
    ".py": "python",
    ".ts": "typescript",
    ".tsx": "typescript",
    ".mts": "typescript",
    ".js": "javascript",
    ".jsx": "javascript",
    ".mjs": "javascript",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".c": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
}


def source_language(path: str, text: str) -> str:
    """The language of a source file of a folder root, by suffix (a header by what it contains)."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix in HEADER_SUFFIXES:
        return header_language(path, text)
    return SOURCE_SUFFIXES.get(suffix, "?")


def header_language(path: str, text: str) -> str:
    """`c` or `cpp` for a header file (by suffix; a `.h` by what it contains)."""
    lang = HEADER_SUFFIXES.get(os.path.splitext(path)[1].lower(), "c")
    if lang == "c" and _CPP_MARKERS.search(text):
        return "cpp"
    return lang


# ----------------------------------------------------------------------------------------------
# Corpus shards


def iter_corpus_lines(shard: Path, on_position: Callable[[int], None] | None = None) -> Iterator[bytes]:
    """Raw JSON lines of one `.jsonl.xz` (or plain `.jsonl`) shard; parsing happens in the workers.
    `on_position` gets the bytes of the file (compressed, for .xz) read so far before each line: progress."""
    with open(shard, "rb") as raw:
        f = lzma.open(raw, "rb") if shard.suffix == ".xz" else raw
        for line in f:
            if line.strip():
                if on_position is not None:
                    on_position(raw.tell())
                yield line


# ----------------------------------------------------------------------------------------------
# C/C++ headers and their licences


def iter_header_files(root: Path) -> Iterator[Path]:
    """Every header file under `root`, in a stable order."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if os.path.splitext(name)[1].lower() in HEADER_SUFFIXES:
                yield Path(dirpath) / name


def dpkg_owners(info_dir: Path = Path("/var/lib/dpkg/info")) -> dict[str, str]:
    """Installed file path -> Debian package name, from dpkg's file lists (empty where there is no dpkg)."""
    owners: dict[str, str] = {}
    for listing in sorted(info_dir.glob("*.list")) if info_dir.is_dir() else []:
        package = listing.stem.split(":", 1)[0]
        for line in listing.read_text(encoding="utf-8", errors="replace").splitlines():
            owners.setdefault(line, package)
    return owners


def debian_license(copyright_file: Path) -> str | None:
    """The licence of a package's own files (`Files: *` of a machine-readable copyright file), or None
    when the file is missing or free-form (then nothing says which licence a header has)."""
    try:
        text = copyright_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    if not text.startswith("Format:"):
        return None
    for stanza in re.split(r"\n\s*\n", text):
        fields = dict(re.findall(r"^(Files|License):[ \t]*(.*)$", stanza, re.M))
        if fields.get("Files", "").split() == ["*"] and fields.get("License"):
            return fields["License"].strip()
    return None


def corpus_record(line: bytes) -> dict:
    """One corpus line parsed, with the fields the builder relies on checked."""
    row = json.loads(line)
    if not isinstance(row.get("text"), str) or not isinstance(row.get("path"), str):
        raise ValueError("corpus record without text or path")
    return row
