"""Walking folders of source files and finding where each file comes from (distribution, licence).

Roots are folders of `.py` files (the standard library, site-packages, a PyPI corpus folder with a
`corpus.json`), folders of C/C++ headers, and corpus shards (`.jsonl.xz`, one record a line, each
with its own provenance: see `dfim.engine.training.sources`).
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dfim.engine.training.sources import (
    HEADER_SUFFIXES,
    SOURCE_SUFFIXES,
    debian_license,
    dpkg_owners,
    iter_header_files,
)

# Path parts that mark copies of other projects' code (their licence and their duplicates).
VENDOR_PARTS = {"_vendor", "vendor", "vendored", "_vendored", "third_party", "thirdparty", "extern"}
SKIP_DIRS = {"__pycache__", ".git", ".hg", ".svn", "node_modules", ".tox", ".venv"}
# Skipped only inside the standard library: its test suite (huge, odd on purpose) and IDLE.
STDLIB_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "turtledemo"}
STDLIB_LICENSE = "PSF-2.0"
# What a plain folder gives besides .py files (see `iter_files`).
OTHER_SOURCE_SUFFIXES = tuple(sorted((set(SOURCE_SUFFIXES) | set(HEADER_SUFFIXES)) - {".py"}))


@dataclass
class Root:
    path: Path
    # "stdlib" | "site-packages" | "corpus" (a folder with a corpus.json) | "dir" (all .py files) |
    # "shard" (a .jsonl.xz file of corpus records) | "headers" (C/C++ header files)
    kind: str


def default_roots() -> list[Root]:
    import site
    import sysconfig

    roots = [Root(Path(sysconfig.get_paths()["stdlib"]), "stdlib")]
    seen = {roots[0].path.resolve()}
    candidates = list(site.getsitepackages())
    user = site.getusersitepackages()
    candidates += [user] if isinstance(user, str) else list(user)
    candidates += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    for p in candidates:
        path = Path(p)
        if path.is_dir() and path.resolve() not in seen:
            seen.add(path.resolve())
            roots.append(Root(path, "site-packages"))
    return roots


def classify_root(path: Path) -> Root:
    import sysconfig

    if path.resolve() == Path(sysconfig.get_paths()["stdlib"]).resolve():
        return Root(path, "stdlib")
    if path.name in ("site-packages", "dist-packages") or any(path.glob("*.dist-info")):
        return Root(path, "site-packages")
    if (path / "corpus.json").is_file():
        return Root(path, "corpus")
    return Root(path, "dir")


def corpus_distributions(root: Path) -> dict[str, Dist]:
    """Top folder -> Dist, from the corpus.json that scripts/fetch_corpus.py writes."""
    entries = json.loads((root / "corpus.json").read_text(encoding="utf-8"))
    return {
        folder: Dist(e.get("name", folder), e.get("version", "?"), e.get("license") or "UNKNOWN")
        for folder, e in entries.items()
    }


def is_vendored(rel_parts: Sequence[str]) -> bool:
    return any(p in VENDOR_PARTS for p in rel_parts)


def iter_files(root: Root) -> Iterator[tuple[Path, str | None]]:
    """(path, reason-to-skip or None) for every .py file (header file, for a headers root) under the root; a
    plain folder (the user's own code) gives the files of every language the server serves."""
    all_languages = root.kind == "dir"
    if root.kind == "headers":
        for path in iter_header_files(root.path):
            rel = path.relative_to(root.path).parts
            yield path, ("vendored" if is_vendored(rel[:-1]) else None)
        return
    for dirpath, dirnames, filenames in os.walk(root.path):
        d = Path(dirpath)
        skip = SKIP_DIRS | (STDLIB_SKIP_DIRS if root.kind == "stdlib" else set())
        dirnames[:] = sorted(
            n for n in dirnames if n not in skip and not n.endswith((".dist-info", ".egg-info"))
        )
        if "/shared/data/" in d.as_posix() + "/":  # evaluation sets: never read, only counted
            for name in filenames:
                if name.endswith(".py"):
                    yield d / name, "eval_data_path"
            continue
        for name in sorted(filenames):
            if name.endswith(".py") or (all_languages and name.endswith(OTHER_SOURCE_SUFFIXES)):
                path = d / name
                rel = path.relative_to(root.path).parts
                yield path, ("vendored" if is_vendored(rel[:-1]) else None)


def _metadata_fields(text: str) -> dict[str, list[str]]:
    """The header of a METADATA / PKG-INFO file (RFC 822 style, stops at the body)."""
    out: dict[str, list[str]] = defaultdict(list)
    for line in text.splitlines():
        if not line.strip():
            break
        if line[:1] in " \t" or ":" not in line:
            continue
        key, _, value = line.partition(":")
        out[key.strip().lower()].append(value.strip())
    return out


def license_of(fields: dict[str, list[str]]) -> str:
    if fields.get("license-expression"):
        return fields["license-expression"][0]
    classifiers = [c for c in fields.get("classifier", []) if c.startswith("License ::")]
    if classifiers:
        return "; ".join(sorted({c.split("::")[-1].strip() for c in classifiers}))
    lic = (fields.get("license") or [""])[0].strip()
    if lic and lic.upper() != "UNKNOWN" and len(lic) <= 80:
        return lic
    return "see METADATA" if lic else "UNKNOWN"


@dataclass
class Dist:
    name: str
    version: str
    license: str


def distributions(site_dir: Path) -> tuple[dict[str, Dist], dict[str, Dist]]:
    """(relative file path -> Dist from RECORD files, top-level name -> Dist) for a site-packages."""
    by_file: dict[str, Dist] = {}
    by_top: dict[str, Dist] = {}
    for info in sorted(site_dir.glob("*.dist-info")) + sorted(site_dir.glob("*.egg-info")):
        meta_path = info / ("METADATA" if info.suffix == ".dist-info" else "PKG-INFO")
        try:
            fields = _metadata_fields(meta_path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        dist = Dist(
            (fields.get("name") or [info.name.split("-")[0]])[0],
            (fields.get("version") or ["?"])[0],
            license_of(fields),
        )
        record = info / "RECORD"
        if record.is_file():
            for line in record.read_text(encoding="utf-8", errors="replace").splitlines():
                rel = line.split(",", 1)[0]
                if rel.endswith(".py"):
                    by_file[os.path.normpath(rel)] = dist
                    by_top.setdefault(rel.split("/", 1)[0].removesuffix(".py"), dist)
        top = info / "top_level.txt"
        if top.is_file():
            for name in top.read_text(encoding="utf-8", errors="replace").split():
                by_top.setdefault(name, dist)
    return by_file, by_top


class HeaderLicenses:
    """Finds the licence of a header file: the Python distribution that ships it (torch's and numpy's
    include folders sit in site-packages) or the Debian package that installed it."""

    def __init__(self) -> None:
        self._owners: dict[str, str] | None = None
        self._package_license: dict[str, str | None] = {}
        self._site: dict[Path, dict[str, Dist]] = {}  # site-packages folder -> top-level name -> Dist

    def find(self, path: Path) -> tuple[str, str] | None:
        """(where the licence was found, licence) or None when it cannot be attributed."""
        parts = path.resolve().parts
        for marker in ("site-packages", "dist-packages"):
            if marker in parts[:-1]:
                at = parts.index(marker)
                site = Path(*parts[: at + 1])
                if site not in self._site:
                    self._site[site] = distributions(site)[1]
                dist = self._site[site].get(parts[at + 1])
                return (f"pypi:{dist.name}", dist.license) if dist else None
        if self._owners is None:
            self._owners = dpkg_owners()
        package = self._owners.get(str(path)) or self._owners.get(str(path.resolve()))
        if package is None:
            return None
        if package not in self._package_license:
            self._package_license[package] = debian_license(Path("/usr/share/doc") / package / "copyright")
        lic = self._package_license[package]
        return (f"deb:{package}", lic) if lic else None
