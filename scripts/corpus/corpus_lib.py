"""Shared helpers for building the dfim multilingual infilling corpus.

Why a separate module: the driver (``build_corpus.py``) runs the per-archive
work in worker processes; keeping the pure functions here makes them
importable by the workers and testable on their own.

Everything here works on in-memory archive members, so nothing has to be
unpacked to disk (the build machine has 2 cores and little patience).
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import lzma
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# --------------------------------------------------------------------------
# Languages
# --------------------------------------------------------------------------

EXT_LANG: dict[str, str] = {
    ".ts": "typescript",
    ".tsx": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".js": "javascript",
    ".jsx": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".c++": "cpp",
    ".hpp": "cpp",
    ".hh": "cpp",
    ".hxx": "cpp",
    ".ipp": "cpp",
    ".inl": "cpp",
    ".tcc": "cpp",
    ".py": "python",
}

#: The language buckets that get (roughly) equal shares of the budget.
LANG_GROUP: dict[str, str] = {
    "typescript": "ts_js",
    "javascript": "ts_js",
    "go": "go",
    "rust": "rust",
    "java": "java",
    "c": "c_cpp",
    "cpp": "c_cpp",
    "python": "python",
}


def lang_of(path: str) -> str | None:
    """Language of a file from its extension (``.h`` is fixed up per project later)."""
    low = path.lower()
    if low.endswith(".d.ts") or low.endswith(".d.mts") or low.endswith(".d.cts"):
        return "typescript"
    return EXT_LANG.get(Path(low).suffix)


# --------------------------------------------------------------------------
# Licences
# --------------------------------------------------------------------------

_PERMISSIVE_PATTERNS: list[tuple[str, str]] = [
    (r"^(mit|expat|mit-0|mit/x11|x11|mit-style|mit license)$", "MIT"),
    (
        r"^(apache|apache-2|apache-2\.0|apache 2\.0|apache2|apache-2\.0\+|apache license 2\.0|apache license, version 2\.0|asl-2\.0|asl 2\.0|apache-2.0-with-llvm-exception|apache-2\.0 with llvm exception)$",
        "Apache-2.0",
    ),
    (r"^bsd-2(-clause)?.*$", "BSD-2-Clause"),
    (r"^bsd-3(-clause)?.*$", "BSD-3-Clause"),
    (r"^(bsd|new bsd|modified bsd|bsd license)$", "BSD-3-Clause"),
    (r"^isc.*$", "ISC"),
    (r"^0bsd$", "0BSD"),
    (r"^(unlicense|the unlicense)$", "Unlicense"),
    (r"^zlib.*$", "Zlib"),
    (r"^(bsl-1\.0|boost|boost-1\.0|bsl)$", "BSL-1.0"),
    (r"^(psf|psf-2\.0|python|python-2\.0).*$", "PSF-2.0"),
    (r"^(public[- ]domain|pd|public domain)$", "public-domain"),
    (r"^cc0(-1\.0)?.*$", "CC0-1.0"),
    (r"^curl$", "curl"),
]


def norm_single_licence(lic: str) -> str | None:
    """Map one licence name (DEP-5, SPDX or free-form) to our SPDX-ish name, or None if not permissive."""
    s = lic.strip().strip("()").strip().lower()
    s = re.sub(r"\s+with\s+.*exception.*$", "", s)  # "BSD-3-clause with PCRE2 exception"
    if not s or re.search(
        r"gpl|mpl|epl|cddl|eupl|osl|sspl|commons-clause|busl|proprietary|cc-by-nc|cc-by-sa", s
    ):
        return None
    for pat, name in _PERMISSIVE_PATTERNS:
        if re.match(pat, s):
            return name
    return None


def norm_licence(expr: str | None) -> str | None:
    """Normalise a licence expression; return a permissive label or None.

    ``A or B`` (also ``A/B`` as old Cargo manifests write it) is accepted when any
    option is permissive (only the permissive options are recorded); ``A and B``
    (also ``A, B``) needs every part permissive.  Parentheses are honoured.
    """
    if not expr:
        return None
    toks = re.findall(
        r"\(|\)|\bOR\b|\bAND\b|/|,|[^()/,\s]+(?:\s+(?!(?:or|and)\b)[^()/,\s]+)*", expr.strip(), flags=re.I
    )
    toks = [t.strip() for t in toks if t.strip()]
    pos = 0

    def peek() -> str:
        return toks[pos] if pos < len(toks) else ""

    def atom() -> list[str] | None:
        nonlocal pos
        t = peek()
        if t == "(":
            pos += 1
            v = or_expr()
            if peek() == ")":
                pos += 1
            return v
        pos += 1
        n = norm_single_licence(t)
        return [n] if n else None

    def and_expr() -> list[str] | None:
        nonlocal pos
        parts = [atom()]
        while peek().upper() == "AND" or peek() == ",":
            pos += 1
            parts.append(atom())
        if any(p is None for p in parts):
            return None
        if len(parts) == 1:
            return parts[0]
        return [" AND ".join(dict.fromkeys(x for p in parts for x in p))]  # type: ignore[union-attr]

    def or_expr() -> list[str] | None:
        nonlocal pos
        opts = [and_expr()]
        while peek().upper() == "OR" or peek() == "/":
            pos += 1
            opts.append(and_expr())
        ok = [x for o in opts if o for x in o]
        return list(dict.fromkeys(ok)) or None

    try:
        res = or_expr()
    except IndexError:
        return None
    return " OR ".join(res) if res else None


@dataclass
class Dep5:
    """A parsed machine-readable debian/copyright: ordered (globs, licence) stanzas."""

    stanzas: list[tuple[list[str], str]] = field(default_factory=list)
    is_dep5: bool = False

    def licence_for(self, relpath: str) -> str | None:
        """Raw licence string of the last stanza whose glob matches (DEP-5 semantics)."""
        found: str | None = None
        for globs, lic in self.stanzas:
            for g in globs:
                if g == "*" or fnmatch.fnmatchcase(relpath, g):
                    found = lic
                    break
        return found

    def main_licence(self) -> str | None:
        for globs, lic in self.stanzas:
            if "*" in globs:
                return lic
        return None


def parse_dep5(text: str) -> Dep5:
    """Parse debian/copyright; returns an empty, non-DEP-5 result for free-form files."""
    d = Dep5()
    if not re.search(r"^Format:\s*\S*(copyright-format|dep5|DEP-5)", text, re.M | re.I):
        return d
    d.is_dep5 = True
    for para in re.split(r"\n\s*\n", text):
        fm = re.search(r"^Files:[ \t]*(.*(?:\n[ \t]+.*)*)", para, re.M)
        lm = re.search(r"^License:[ \t]*(.*)$", para, re.M)
        if fm and lm:
            globs = fm.group(1).split()
            d.stanzas.append((globs, lm.group(1).strip()))
    return d


def guess_licence_from_text(text: str) -> str | None:
    """Very small LICENSE-file classifier, used only when metadata is missing."""
    t = text[:4000].lower()
    if "gnu general public" in t or "gnu lesser" in t or "mozilla public" in t:
        return None
    if "apache license" in t and "version 2.0" in t:
        return "Apache-2.0"
    if "permission is hereby granted, free of charge" in t:
        return "MIT"
    if "redistribution and use in source and binary forms" in t:
        return "BSD-3-Clause" if "neither the name" in t or "endorse or promote" in t else "BSD-2-Clause"
    if (
        "permission to use, copy, modify, and/or distribute" in t
        or "permission to use, copy, modify, and distribute" in t
    ):
        return "ISC"
    if "this is free and unencumbered software" in t:
        return "Unlicense"
    if "boost software license" in t:
        return "BSL-1.0"
    return None


# --------------------------------------------------------------------------
# Archive readers (in memory)
# --------------------------------------------------------------------------


def iter_ar(data: bytes) -> Iterator[tuple[str, bytes]]:
    """Members of a Unix ``ar`` archive (the .deb container)."""
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("not an ar archive")
    pos = 8
    while pos + 60 <= len(data):
        hdr = data[pos : pos + 60]
        name = hdr[:16].decode().strip().rstrip("/")
        size = int(hdr[48:58].decode().strip())
        pos += 60
        yield name, data[pos : pos + size]
        pos += size + (size & 1)


def open_tar_bytes(name: str, data: bytes) -> tarfile.TarFile:
    """Open a (possibly compressed) tarball held in memory; zstd via the ``zstandard`` module if present."""
    if name.endswith(".zst"):
        import zstandard  # type: ignore

        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
        return tarfile.open(fileobj=io.BytesIO(data), mode="r:")
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:*")


def iter_tar_files(tf: tarfile.TarFile, max_bytes: int) -> Iterator[tuple[str, bytes]]:
    """Regular files of a tarball (name, content), skipping ones over ``max_bytes``."""
    for m in tf:
        if not m.isfile() or m.size > max_bytes:
            continue
        f = tf.extractfile(m)
        if f is None:
            continue
        yield m.name, f.read()


# --------------------------------------------------------------------------
# Quality filters
# --------------------------------------------------------------------------

BAD_DIRS = {
    "node_modules",
    "vendor",
    "vendored",
    "third_party",
    "thirdparty",
    "third-party",
    "3rdparty",
    "external",
    "externals",
    "extern",
    "dist",
    "build",
    "generated",
    "bundled",
    "bower_components",
    "min",
    "baselines",
    "fixtures-generated",
    # Python's own vendoring and installed or virtual environments packed into a source archive
    "_vendor",
    "_vendored",
    "site-packages",
    "dist-packages",
    ".tox",
    ".venv",
    "venv",
}
GEN_MARKERS = re.compile(
    r"auto-generated|autogenerated|automatically generated|do not edit|generated by|code generated|@generated|this file is generated|generated file",
    re.I,
)
COMPILED_JS = re.compile(
    r'Object\.defineProperty\(exports, "__esModule"|__awaiter|__createBinding|_interopRequireDefault|//# sourceMappingURL=|__webpack_require__|System\.register\(|var __extends'
)
EVAL_PATH = re.compile(r"humaneval|human_eval|human-eval|multipl-e|multiple-e|multipl_e", re.I)


def path_reject(path: str) -> str | None:
    """Reason to drop a path (vendored/generated/minified/eval), or None."""
    low = path.lower()
    parts = low.split("/")
    for p in parts[:-1]:
        if p in BAD_DIRS or "generated" in p:
            return "path:vendored_or_generated"
    if (
        ".min." in parts[-1]
        or "generated" in parts[-1]
        or parts[-1].endswith((".pb.go", "_pb2.py", ".pb.cc", ".pb.h", "-bundle.js", ".bundle.js"))
    ):
        return "path:generated_or_minified"
    if EVAL_PATH.search(low):
        return "decontam:path"
    return None


def content_reject(text: str, lang: str, nbytes: int) -> str | None:
    """Reason to drop file content (generated, minified, too long lines), or None."""
    if nbytes < 100:
        return "size:too_small"
    if nbytes > 500_000:
        return "size:too_large"
    if GEN_MARKERS.search(text[:600]):
        return "content:generated_marker"
    lines = text.split("\n")
    if max(len(line) for line in lines) > 1000:
        return "content:long_line"
    if nbytes / max(1, len(lines)) > 120:
        return "content:mean_line_len"
    if lang == "javascript" and COMPILED_JS.search(text):
        return "content:compiled_js"
    return None


# --------------------------------------------------------------------------
# Dedup and decontamination
# --------------------------------------------------------------------------


def norm_sha(text: str) -> str:
    """sha256 of whitespace-normalised text (exact-dedup key)."""
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()


NUM_PERM = 128
BANDS = 16
ROWS = NUM_PERM // BANDS
_rng = np.random.default_rng(20240601)
_A = _rng.integers(1, 2**63 - 1, NUM_PERM, dtype=np.uint64) | np.uint64(1)
_B = _rng.integers(0, 2**63 - 1, NUM_PERM, dtype=np.uint64)
_WORD = re.compile(r"\w+")
_MIX = np.array(
    [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5, 0x85EBCA77C2B2AE63],
    dtype=np.uint64,
)


def _tok_hash(tok: str) -> int:
    # blake2b is stable across processes/runs (unlike hash()), and fast enough in C.
    return int.from_bytes(hashlib.blake2b(tok.encode(), digest_size=8).digest(), "little")


_TOKCACHE: dict[str, int] = {}


def minhash(text: str) -> np.ndarray | None:
    """128-permutation MinHash over word 5-gram shingles; None for files under 5 words."""
    toks = _WORD.findall(text)
    if len(toks) < 5:
        return None
    cache = _TOKCACHE
    hs = []
    for t in toks:
        h = cache.get(t)
        if h is None:
            h = _tok_hash(t)
            if len(cache) < 2_000_000:
                cache[t] = h
        hs.append(h)
    th = np.array(hs, dtype=np.uint64)
    n = len(th) - 4
    with np.errstate(over="ignore"):
        sh = th[:n] * _MIX[0]
        for k in range(1, 5):
            sh = (sh ^ (sh >> np.uint64(29))) + th[k : k + n] * _MIX[k]
        sh = np.unique(sh)
        sig = np.empty(NUM_PERM, dtype=np.uint64)
        step = max(1, 4_000_000 // max(1, len(sh)))
        for i in range(0, NUM_PERM, step):
            sig[i : i + step] = ((sh[None, :] * _A[i : i + step, None]) + _B[i : i + step, None]).min(axis=1)
    return sig


def lsh_keys(sig: np.ndarray) -> list[bytes]:
    """One bucket key per LSH band."""
    return [bytes([b]) + sig[b * ROWS : (b + 1) * ROWS].tobytes() for b in range(BANDS)]


def jaccard_est(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(a == b))


def write_xz(path: Path, data: bytes) -> int:
    """Write ``data`` with xz preset 9e; returns compressed size."""
    comp = lzma.compress(data, format=lzma.FORMAT_XZ, preset=9 | lzma.PRESET_EXTREME)
    path.write_bytes(comp)
    return len(comp)


def dumps(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False)
