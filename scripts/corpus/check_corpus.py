#!/usr/bin/env python3
"""Sanity checks of a built corpus directory.

Why: the shards travel separately to a GPU machine (64 MiB per transfer), and the
held-out projects must never leak into training; this re-reads what was written and
checks sizes, record schema, licences, manifest/summary consistency and held-out leakage.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import lzma
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus_lib as cl  # noqa: E402

LANGS = {"typescript", "javascript", "go", "rust", "java", "c", "cpp", "python"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path(".corpus"))
    ap.add_argument("--max-mib", type=float, default=54.0)
    args = ap.parse_args()
    ok = True
    shards = sorted(args.out.glob("train-*.jsonl.xz"))
    if not 1 <= len(shards) <= 2:
        print("expected 1-2 shards, found", len(shards))
        ok = False
    held_sha = set()
    held = args.out / "heldout"
    for p in held.rglob("*"):
        if p.is_file() and p.name != "README.md":
            held_sha.add(cl.norm_sha(p.read_text()))
    n, by_lang, leaks = 0, Counter(), 0
    shas = Counter()
    for s in shards:
        mib = s.stat().st_size / 2**20
        print(f"{s.name}: {mib:.2f} MiB")
        if mib > args.max_mib:
            print("  OVER LIMIT")
            ok = False
        with lzma.open(s, "rt") as f:
            for line in f:
                r = json.loads(line)
                assert set(r) == {"text", "path", "lang", "license", "source"}, r.keys()
                assert r["lang"] in LANGS and cl.norm_licence(r["license"]), (r["path"], r["license"])
                n += 1
                by_lang[r["lang"]] += len(r["text"].encode())
                h = cl.norm_sha(r["text"])
                shas[hashlib.sha256(r["text"].encode()).hexdigest()] += 1
                leaks += h in held_sha
    man = [json.loads(line) for line in gzip.open(args.out / "manifest.jsonl.gz", "rt")]
    summ = json.loads((args.out / "summary.json").read_text())
    print("records", n, "manifest", len(man), "summary", summ["total"]["files"])
    print({k: f"{v / 1e6:.1f} MB" for k, v in by_lang.most_common()})
    if not (n == len(man) == summ["total"]["files"]):
        ok = False
    if Counter(m["sha256"] for m in man) != shas:
        print("manifest sha256 mismatch")
        ok = False
    if leaks:
        print("held-out leaks:", leaks)
        ok = False
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
