"""Fetch extra Python training code from PyPI into a corpus folder that `dfim.engine.training.data` reads.

    python scripts/fetch_corpus.py scripts/corpus_packages.txt --out data-build/corpus --max-mb 180
    tar -C data-build -cJf .carry/corpus.tar.xz corpus        # carried to the GPU machine

Why: the GPU machine holds only its own stdlib and site-packages (~97 M tokens, mostly scientific
and ML libraries) and cannot reach the network, so new code has to travel with a call. This runs
where the package registry is reachable. For every listed package it takes the newest release's
source distribution (or a pure-Python wheel when there is none), keeps only its `.py` files (tests
included: they are real code), and records name, version, license and download hash in
`corpus.json`; packages under a copyleft or unknown license are skipped. `dfim.engine.training.data` reads that file as the provenance of everything under the folder; the
usual filters (vendored, generated, minified, duplicates, the HumanEval overlap) still apply there.
Lines of the package list: `name` or `name==version`; `#` starts a comment.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import io
import json
import re
import sys
import tarfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

PYPI = "https://pypi.org/pypi"
MAX_FILE_BYTES = 1 << 20  # larger .py files are almost always generated tables
# The shipped weights are trained on permissively licensed code only: copyleft (GPL family) and
# packages whose metadata names no license are left out (decision 30).
COPYLEFT = re.compile(r"GPL|General Public|copyleft", re.IGNORECASE)


def permissive(license_name: str) -> bool:
    return license_name != "UNKNOWN" and not COPYLEFT.search(license_name)


def read_list(path: Path) -> list[tuple[str, str | None]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out.append((name.strip(), version.strip() or None))
    return out


def license_of(info: dict) -> str:
    """SPDX expression if given, else a short license field, else the trove classifier."""
    expr = (info.get("license_expression") or "").strip()
    if expr:
        return expr
    text = (info.get("license") or "").strip()
    if text and len(text) <= 60 and "\n" not in text:
        return text
    for c in info.get("classifiers") or []:
        if c.startswith("License :: "):
            return c.rsplit(" :: ", 1)[-1]
    return "UNKNOWN"


def pick_file(files: list[dict]) -> dict | None:
    sdists = [f for f in files if f["packagetype"] == "sdist"]
    wheels = [
        f for f in files if f["packagetype"] == "bdist_wheel" and f["filename"].endswith("-none-any.whl")
    ]
    return (sdists or wheels or [None])[0]


def py_members(blob: bytes, filename: str) -> dict[str, bytes]:
    """Relative path (top folder stripped) -> bytes, for every .py member of an archive."""
    found: dict[str, bytes] = {}
    if filename.endswith(".whl") or filename.endswith(".zip"):
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            for info in z.infolist():
                if info.filename.endswith(".py") and info.file_size <= MAX_FILE_BYTES:
                    found[info.filename] = z.read(info)
    else:
        with tarfile.open(fileobj=io.BytesIO(blob)) as t:
            for m in t.getmembers():
                if m.isfile() and m.name.endswith(".py") and m.size <= MAX_FILE_BYTES:
                    fh = t.extractfile(m)
                    if fh is not None:
                        found[m.name] = fh.read()
    if not filename.endswith(".whl"):  # sdists wrap everything in one "<name>-<version>/" folder
        found = {
            str(PurePosixPath(*PurePosixPath(k).parts[1:])): v
            for k, v in found.items()
            if len(PurePosixPath(k).parts) > 1
        }
    safe = {}
    for rel, data in found.items():
        parts = PurePosixPath(rel).parts
        if parts and not PurePosixPath(rel).is_absolute() and ".." not in parts:
            safe[rel] = data
    return safe


def fetch(name: str, version: str | None) -> dict:
    url = f"{PYPI}/{name}/{version}/json" if version else f"{PYPI}/{name}/json"
    with urllib.request.urlopen(url, timeout=60) as r:
        meta = json.load(r)
    info = meta["info"]
    chosen = pick_file(meta["urls"])
    if chosen is None:
        raise RuntimeError("no sdist and no pure-Python wheel")
    # Mirrors of the registry may answer with URLs relative to the JSON page.
    with urllib.request.urlopen(urllib.parse.urljoin(url, chosen["url"]), timeout=300) as r:
        blob = r.read()
    sha = hashlib.sha256(blob).hexdigest()
    if sha != chosen["digests"]["sha256"]:
        raise RuntimeError("sha256 mismatch")
    return {
        "name": info["name"],
        "version": info["version"],
        "license": license_of(info),
        "file": chosen["filename"],
        "sha256": sha,
        "members": py_members(blob, chosen["filename"]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("packages", type=Path, help="package list, one `name[==version]` a line")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-mb", type=float, default=180.0, help="stop adding packages past this much .py")
    ap.add_argument("--jobs", type=int, default=8)
    args = ap.parse_args(argv)

    wanted = read_list(args.packages)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, dict] = {}
    total = 0
    with cf.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(fetch, n, v) for n, v in wanted]
        for (name, _), fut in zip(wanted, futures, strict=True):  # list order decides what fits
            try:
                got = fut.result()
            except Exception as e:  # noqa: BLE001 - one bad package must not stop the corpus
                print(f"skip {name}: {e}", file=sys.stderr)
                continue
            if not permissive(got["license"]):
                print(f"skip {name}: license {got['license']!r} is not permissive", file=sys.stderr)
                continue
            size = sum(len(b) for b in got["members"].values())
            if total + size > args.max_mb * 1e6:
                print(f"skip {name}: {size / 1e6:.1f} MB would pass --max-mb", file=sys.stderr)
                continue
            folder = f"{got['name']}-{got['version']}"
            for rel, data in got["members"].items():
                path = args.out / folder / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            total += size
            manifest[folder] = {k: got[k] for k in ("name", "version", "license", "file", "sha256")}
            manifest[folder]["py_files"] = len(got["members"])
            manifest[folder]["py_bytes"] = size
            print(f"{folder:40s} {len(got['members']):6d} files {size / 1e6:7.1f} MB  {got['license']}")
    (args.out / "corpus.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"{len(manifest)} packages, {total / 1e6:.1f} MB of .py in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
