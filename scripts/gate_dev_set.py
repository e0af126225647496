"""Build the confidence gate's development set: a git repository whose last commit adds back functions of
real Python packages, for `dfim replay --git` (which types each run of added lines in place, with the
rest of the file as prefix and suffix).

    python scripts/gate_dev_set.py OUT --packages pygls [--files 6] [--functions 2]

Source: the Python files of packages installed in this interpreter that dfim-base never trained on (the
script refuses a package its data manifests, docs/bench/data_manifest-dfim-base*.jsonl.gz, name, and any
file whose bytes the manifest holds) and whose licence is permissive. None of them is an evaluation set
(HumanEval, the held-out corpus, this repository's own code). Files are chosen by a hash of their path
(deterministic, spread over the package), 3-40 KB, tests left out; in each, up to `--functions` function
definitions of 4-30 lines (by `ast`) are removed in the first commit and added back in the second.
`OUT/provenance.json` lists package, version, licence and file of every region.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The data build's manifest (versions 1-2), and the Python shard version 3 added (the corpus builder's
# manifest: a `source` such as "pypi:cattrs==26.2.1" or "deb-src:python-attrs", and sha256 of the text).
MANIFESTS = sorted((ROOT / "docs" / "bench").glob("data_manifest-dfim-base*.jsonl.gz"))
PERMISSIVE = ("MIT", "Apache-2.0", "BSD", "ISC")


def dist_name(row: dict) -> str:
    """A manifest row's distribution name, normalised: its `dist`, else the package in its `source`."""
    name = row.get("dist") or row.get("source", "").split(":", 1)[-1].split("==")[0]
    name = name.lower().replace("_", "-")
    return name.removeprefix("python-") if row.get("source", "").startswith("deb") else name


def trained() -> tuple[set[str], set[str]]:
    """(distribution names, file sha1s and sha256s) of dfim-base's training data."""
    names, hashes = set(), set()
    for manifest in MANIFESTS:
        with gzip.open(manifest, "rt", encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                names.add(dist_name(row))
                hashes.update(row.get(key, "") for key in ("sha1", "sha256"))
    hashes.discard("")
    return names, hashes


def licence(dist: importlib.metadata.Distribution) -> str:
    meta = dist.metadata
    return meta.get("License-Expression") or meta.get("License") or ""


def functions(source: str, lo: int = 4, hi: int = 30) -> list[tuple[int, int]]:
    """(first, end) 0-based line spans of function definitions lo..hi lines long, decorators included."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            if lo <= node.end_lineno - first <= hi:
                spans.append((first, node.end_lineno))
    return sorted(spans)


def git(repo: Path, *args: str) -> None:
    env_args = ["-c", "user.name=dfim", "-c", "user.email=dfim@localhost", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "-C", str(repo), *env_args, *args], check=True, capture_output=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--packages", nargs="+", required=True, help="import names of installed packages")
    parser.add_argument("--files", type=int, default=6, help="files per package")
    parser.add_argument("--functions", type=int, default=2, help="functions removed per file")
    args = parser.parse_args(argv)
    names, hashes = trained()
    out: Path = args.out
    if out.exists():
        print(f"{out}: exists", file=sys.stderr)
        return 2
    out.mkdir(parents=True)
    git(out, "init", "-q")
    before: dict[Path, str] = {}
    after: dict[Path, str] = {}
    provenance = []
    for package in args.packages:
        dists = importlib.metadata.packages_distributions().get(package, [])
        dist = importlib.metadata.distribution(dists[0] if dists else package)
        name = dist.metadata["Name"].lower().replace("_", "-")
        if name in names:
            print(f"{package}: in dfim-base's training data, refused", file=sys.stderr)
            return 2
        lic = licence(dist)
        if not any(p in lic for p in PERMISSIVE):
            print(f"{package}: licence {lic!r} is not permissive, refused", file=sys.stderr)
            return 2
        folder = Path(str(dist.locate_file(package)))
        files = [
            p
            for p in folder.rglob("*.py")
            if 3_000 <= p.stat().st_size <= 40_000 and "test" not in p.relative_to(folder).as_posix()
        ]
        files.sort(key=lambda p: hashlib.sha1(p.relative_to(folder).as_posix().encode()).hexdigest())
        taken = 0
        for path in files:
            if taken >= args.files:
                break
            raw = path.read_bytes()
            if hashlib.sha1(raw).hexdigest() in hashes or hashlib.sha256(raw).hexdigest() in hashes:
                continue
            source = raw.decode("utf-8")
            spans = functions(source)
            if not spans:
                continue
            step = max(1, len(spans) // args.functions)
            chosen = spans[::step][: args.functions]
            lines = source.splitlines(keepends=True)
            removed = {n for first, end in chosen for n in range(first, end)}
            rel = Path(package) / path.relative_to(folder)
            before[rel] = "".join(line for n, line in enumerate(lines) if n not in removed)
            after[rel] = source
            provenance += [
                {
                    "package": package,
                    "version": dist.version,
                    "licence": lic,
                    "file": rel.as_posix(),
                    "lines": [a + 1, b],
                }
                for a, b in chosen
            ]
            taken += 1
    for contents in (before, after):
        for rel, text in contents.items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_text(text, encoding="utf-8")
        git(out, "add", "-A")
        git(out, "commit", "-q", "-m", "functions removed" if contents is before else "functions added back")
    (out / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n", encoding="utf-8")
    print(f"{out}: {len(after)} files, {len(provenance)} functions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
