#!/usr/bin/env python3
"""Builder of dfim-base's Python-only training shards (train-02, train-03, train-04, ...).

Why Python has its own shards: the multilingual corpus (``build_corpus.py``, train-00/01) gives each
language group an equal share and keeps only a small Python slice, while dfim is used most on Python.
Python code comes from the same kind of registries (Debian ``python-*`` source packages, PyPI sdists),
read by ``build_corpus``'s archive reader, licence resolution, filters, HumanEval decontamination and
MinHash, so a Python shard obeys the same rules as the multilingual ones.

``fetch``  download the archives listed in ``python_packages.txt`` (pinned versions and file names).
``build``  read them (results cached per archive), keep Python files with a permissive licence, drop
           exact copies of the multilingual shards' files (``--existing-manifest``), exact and near
           duplicates among themselves, and every file of an earlier Python shard together with its
           near duplicates (``--prior-manifest``, repeatable), pick files up to ``--target-mib`` of xz
           (at most 3% of the budget from one project) and write ``train-NN.jsonl.xz`` (concatenated
           xz streams; ``lzma.open`` and ``xz -d`` read them as one file), ``manifest.jsonl.gz`` and
           ``summary.json``.

Several shards come from one download: each later shard is built with the manifests of the earlier
ones, so it holds the next files of the same hash order and nothing an earlier shard already taught.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import gzip
import hashlib
import json
import lzma
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_corpus as bc  # noqa: E402
import corpus_lib as cl  # noqa: E402

HERE = Path(__file__).resolve().parent
RECORD_FIELDS = ("text", "path", "lang", "license", "source")
# The same near-duplicate rule as the multilingual corpus (estimated Jaccard of word 5-grams).
NEAR_THRESHOLD = 0.85
# No project may fill more than this share of a shard: a few huge sdists would otherwise dominate.
PROJECT_CAP_FRAC = 0.03
# Selection may overshoot the estimated raw budget a little; the compression phases trim it exactly.
SELECT_SLACK = 1.08
# Phase 1 compresses this share of the estimated budget in two parallel xz streams (two cores);
# phase 2 fills the rest with the ratio phase 1 observed, which is better than a sample's estimate.
PHASE1_FRAC = 0.8
SAMPLE_BYTES = 8_000_000
log = bc.log


# --------------------------------------------------------------------------
# package list and fetch
# --------------------------------------------------------------------------


def read_list(path: Path) -> list[dict[str, Any]]:
    """Entries of ``python_packages.txt``: kind, name, version and the archive's file names."""
    entries = []
    for p in bc.read_packages(path):
        if p["kind"] not in ("deb-src", "pypi"):
            raise SystemExit(f"{path}: unknown kind {p['kind']!r} for {p['name']}")
        entries.append({**p, "files": p["files"].split(",")})
    return entries


def deb_dir(scratch: Path) -> Path:
    """Debian tarballs; the layout train-02..04 were built from, so their cache keys still match."""
    return scratch / "src" / "py"


def pypi_dir(scratch: Path) -> Path:
    """PyPI sdists."""
    return scratch / "pypi-py"


def _download(url: str, out: Path) -> str | None:
    """Download ``url`` to ``out`` (atomically); the error text on failure."""
    if out.exists():
        return None
    try:
        with urllib.request.urlopen(url, timeout=120) as r:
            data = r.read()
    except Exception as e:  # a mirror gap: the build reports the archive as not downloaded
        return f"{url}: {e}"
    part = out.with_name(out.name + ".part")
    part.write_bytes(data)
    os.replace(part, out)
    return None


def fetch(args: argparse.Namespace) -> None:
    """Download every listed archive file that is not in the scratch directory yet (2 at a time)."""
    entries = read_list(args.packages)
    deb_dir(args.scratch).mkdir(parents=True, exist_ok=True)
    pypi_dir(args.scratch).mkdir(parents=True, exist_ok=True)

    def get(e: dict[str, Any]) -> list[str]:
        if e["kind"] == "pypi":
            sdist = pypi_dir(args.scratch) / e["files"][0]
            if not sdist.exists():
                bc.fetch_pypi_sdist(e["name"], sdist.parent, version=e["version"], filename=sdist.name)
            return [] if sdist.exists() else [f"pypi {e['name']}=={e['version']}: {sdist.name}"]
        # Debian's pool layout: pool/main/<first letter, or lib + one letter>/<source>/<file>
        prefix = e["name"][:4] if e["name"].startswith("lib") else e["name"][0]
        base = f"{args.debian_mirror}/pool/main/{prefix}/{e['name']}"
        errors = (_download(f"{base}/{f}", deb_dir(args.scratch) / f) for f in e["files"])
        return [err for err in errors if err]

    failed = 0
    with cf.ThreadPoolExecutor(2) as ex:
        for i, errors in enumerate(ex.map(get, entries)):
            failed += bool(errors)
            for err in errors:
                log("not fetched:", err)
            if i % 200 == 0:
                log(f"  {i}/{len(entries)} archives")
    log(f"fetched {len(entries) - failed} of {len(entries)} listed archives")


# --------------------------------------------------------------------------
# build: archives -> candidate files
# --------------------------------------------------------------------------


def discover(scratch: Path, entries: list[dict[str, Any]], drops: Counter) -> list[dict[str, Any]]:
    """The listed archives whose files are all downloaded, as ``build_corpus.process_archive`` input."""
    archs = []
    for e in entries:
        folder = deb_dir(scratch) if e["kind"] == "deb-src" else pypi_dir(scratch)
        files = [folder / f for f in e["files"]]
        if not all(f.exists() for f in files):
            drops["archive:not_downloaded"] += 1
            continue
        deb = e["kind"] == "deb-src"
        archs.append(
            {
                "kind": e["kind"],
                "files": [str(f) for f in files],
                "project": e["name"] if deb else f"py-{e['name']}",
                "version": e["version"],
                "source": f"deb-src:{e['name']}_{e['version']}"
                if deb
                else f"pypi:{e['name']}=={e['version']}",
                "python": True,
                "python_only": True,
            }
        )
    return archs


def cache_path(cache_dir: Path, arch: dict[str, Any]) -> Path:
    """Where one archive's reading is kept: reading is most of a build's time, the rest is minutes."""
    return cache_dir / (hashlib.md5(json.dumps(arch["files"]).encode()).hexdigest() + ".pkl")


def read_archives(
    archs: list[dict[str, Any]], cache_dir: Path, humaneval: Path, workers: int
) -> Iterator[dict[str, Any]]:
    """``process_archive`` results: cached ones first, then the others read in a pool and cached."""
    he_sigs, he_names = bc.load_humaneval(humaneval)
    cached = [a for a in archs if cache_path(cache_dir, a).exists()]
    todo = [a for a in archs if not cache_path(cache_dir, a).exists()]
    log(f"{len(cached)} archives cached, {len(todo)} to read")
    for a in cached:
        with cache_path(cache_dir, a).open("rb") as f:
            yield pickle.load(f)
    if not todo:
        return
    # small archives first: under a shared load the big ones (mostly not Python) cost the most
    todo.sort(key=lambda a: sum(os.path.getsize(f) for f in a["files"]))
    with mp.Pool(workers, initializer=bc._init_worker, initargs=(he_sigs, he_names)) as pool:
        for res in pool.imap_unordered(bc.process_archive, todo, chunksize=1):
            dest = cache_path(cache_dir, res["arch"])
            tmp = dest.with_name(dest.name + ".tmp")
            with tmp.open("wb") as f:
                pickle.dump(res, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, dest)
            yield res


def read_sha256s(manifests: list[Path]) -> set[str]:
    """sha256 of every file the given manifests list."""
    out: set[str] = set()
    for path in manifests:
        with gzip.open(path, "rt") as f:
            out.update(json.loads(line)["sha256"] for line in f)
    return out


def dedup(
    recs: list[dict[str, Any]], existing: set[str], prior: set[str]
) -> tuple[list[dict[str, Any]], Counter]:
    """Records to keep, and why the others went.

    ``existing``: files of the multilingual shards; an exact copy is dropped (their texts are not at
    hand, so near copies cannot be found). ``prior``: files of earlier Python shards, read from the
    same archives, so they are among ``recs``: sorted first, each leads its near-duplicate cluster and
    the whole cluster is dropped, so a later shard never repeats an earlier one, even with edits.
    """
    for r in recs:
        r["sha256"] = hashlib.sha256(r["text"].encode()).hexdigest()
    recs.sort(key=lambda r: (r["sha256"] not in prior, r["source"], r["path"]))
    keep = [True] * len(recs)
    counts: Counter = Counter()
    seen: set[str] = set()
    for i, r in enumerate(recs):
        if r["sha256"] in existing:
            keep[i] = False
            counts["exact_duplicate_of_existing_shards"] += 1
        elif r["sha"] in seen:  # whitespace-normalised text: a copy differing only in spacing
            keep[i] = False
            counts["exact_duplicate"] += 1
        else:
            seen.add(r["sha"])
    uf = bc.UF(len(recs))
    buckets: dict[bytes, int] = {}
    for i, r in enumerate(recs):
        if not keep[i] or r["sig"] is None:
            continue
        for key in cl.lsh_keys(r["sig"]):
            j = buckets.setdefault(key, i)
            if (
                j != i
                and uf.find(i) != uf.find(j)
                and cl.jaccard_est(r["sig"], recs[j]["sig"]) >= NEAR_THRESHOLD
            ):
                uf.union(i, j)
    for i, r in enumerate(recs):
        if keep[i] and r["sig"] is not None and uf.find(i) != i:
            keep[i] = False  # union-find roots are the smallest index: the cluster's first member stays
            counts["near_duplicate"] += 1
    for i, r in enumerate(recs):
        if keep[i] and r["sha256"] in prior:
            keep[i] = False
            counts["in_prior_shard"] += 1
    return [r for i, r in enumerate(recs) if keep[i]], counts


# --------------------------------------------------------------------------
# build: selection and the compressed shard
# --------------------------------------------------------------------------


def record_line(r: dict[str, Any]) -> str:
    """One line of the shard: exactly the fields the data build reads."""
    return cl.dumps({k: r[k] for k in RECORD_FIELDS}) + "\n"


def shuffle_key(r: dict[str, Any]) -> str:
    return hashlib.sha1(("shuffle" + r["sha"] + r["path"]).encode()).hexdigest()


def xz_ratio(recs: list[dict[str, Any]]) -> float:
    """Raw/xz size ratio of the first ``SAMPLE_BYTES`` of these records, serialised as written."""
    blob = "".join(record_line(r) for r in recs[:20000]).encode()[:SAMPLE_BYTES]
    return len(blob) / len(lzma.compress(blob, preset=9 | lzma.PRESET_EXTREME))


def select(
    train: list[dict[str, Any]], target_mib: float, drops: Counter
) -> tuple[list[dict[str, Any]], float]:
    """Files in hash order up to the estimated raw budget, each project capped; shuffled for writing."""
    ratio = xz_ratio(sorted(train, key=shuffle_key))
    raw_budget = target_mib * 2**20 * ratio
    proj_cap = PROJECT_CAP_FRAC * raw_budget
    log(f"xz ratio {ratio:.2f}; raw budget {raw_budget / 1e6:.0f} MB; project cap {proj_cap / 1e6:.1f} MB")
    selected, used, proj_used = [], 0, Counter()
    for r in sorted(train, key=lambda r: hashlib.md5(r["sha"].encode()).hexdigest()):
        if used + r["bytes"] > raw_budget * SELECT_SLACK:
            drops["select:over_budget"] += 1
        elif proj_used[r["project"]] + r["bytes"] > proj_cap:
            drops["select:project_cap"] += 1
        else:
            proj_used[r["project"]] += r["bytes"]
            used += r["bytes"]
            selected.append(r)
    selected.sort(key=shuffle_key)
    log(f"selected {len(selected)} files {used / 1e6:.0f} MB raw")
    return selected, ratio


def compress(chunks: list[list[dict[str, Any]]], tmp: Path, tag: str) -> list[Path]:
    """Each chunk as its own ``xz -9e`` stream, in parallel (one core each)."""
    procs = []
    for k, chunk in enumerate(chunks):
        raw = tmp / f"{tag}-{k}.jsonl"
        with raw.open("w") as f:
            f.writelines(record_line(r) for r in chunk)
        procs.append((raw, subprocess.Popen(["xz", "-9e", "-T1", "-f", str(raw)])))
    for raw, p in procs:
        if p.wait() != 0:
            raise SystemExit(f"xz failed on {raw}")
    return [raw.with_name(raw.name + ".xz") for raw, _ in procs]


def write_shard(
    selected: list[dict[str, Any]], dest: Path, tmp: Path, target_mib: float, max_mib: float
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Write the shard to about ``target_mib`` and never over ``max_mib``; the records it holds."""
    ratio_sel = xz_ratio(selected)  # project caps change the mix, so measure the selection itself
    raw_budget = target_mib * 2**20 * ratio_sel
    cum, n1 = 0, 0
    while n1 < len(selected) and cum + selected[n1]["bytes"] <= PHASE1_FRAC * raw_budget:
        cum += selected[n1]["bytes"]
        n1 += 1
    streams = compress([selected[: n1 // 2], selected[n1 // 2 : n1]], tmp, "p1")
    c1 = sum(s.stat().st_size for s in streams)
    observed = cum / c1
    log(f"phase 1: {cum / 1e6:.0f} MB raw -> {c1 / 2**20:.2f} MiB (ratio {observed:.2f})")
    rest, want, final = selected[n1:], (target_mib * 2**20 - c1) * observed * 0.98, []
    for attempt in range(4):  # shrink phase 2 until the shard is under the hard limit
        acc, j = 0, 0
        while j < len(rest) and acc + rest[j]["bytes"] <= want:
            acc += rest[j]["bytes"]
            j += 1
        final = rest[:j]
        tail = compress([final], tmp, "p2")[0] if final else None
        s2 = tail.stat().st_size if tail else 0
        log(f"phase 2 try {attempt}: {acc / 1e6:.1f} MB raw -> {s2 / 2**20:.2f} MiB")
        if c1 + s2 <= max_mib * 2**20:
            break
        want *= 0.85
    else:
        final, tail = [], None
    part = dest.with_name(dest.name + ".tmp")
    with part.open("wb") as out:
        for stream in streams + ([tail] if tail else []):
            out.write(stream.read_bytes())
            stream.unlink()
    os.replace(part, dest)
    ratios = {"selection_ratio": round(ratio_sel, 3), "observed_ratio": round(observed, 3)}
    return selected[:n1] + final, ratios


def write_manifest(path: Path, written: list[dict[str, Any]]) -> None:
    """One row per file (path, licence, source archive, sha256): what a later shard must not repeat."""
    with gzip.open(path, "wt") as f:
        for r in sorted(written, key=lambda r: r["path"]):
            row = {k: r[k] for k in ("path", "lang", "license", "source", "sha256", "bytes")}
            f.write(json.dumps(row) + "\n")


def aggregate(written: list[dict[str, Any]], key: str) -> dict[str, dict[str, int]]:
    """Files, bytes and estimated tokens (bytes / 3.5) per value of ``key``, largest first."""
    d: dict[str, dict[str, int]] = defaultdict(lambda: {"files": 0, "bytes": 0})
    for r in written:
        d[r[key]]["files"] += 1
        d[r[key]]["bytes"] += r["bytes"]
    ordered = sorted(d.items(), key=lambda kv: -kv[1]["bytes"])
    return {k: {**v, "est_tokens": int(v["bytes"] / 3.5)} for k, v in ordered}


def build(args: argparse.Namespace) -> None:
    """Read, filter, dedup, select and write one Python shard with its manifest and summary."""
    t0 = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.scratch / "pyshard-tmp"
    (tmp / "cache").mkdir(parents=True, exist_ok=True)
    drops: Counter = Counter()
    archs = discover(args.scratch, read_list(args.packages), drops)
    log(f"{len(archs)} archives downloaded of those listed")
    if args.cached_only:
        uncached = [a for a in archs if not cache_path(tmp / "cache", a).exists()]
        if uncached:
            drops["archive:not_cached"] += len(uncached)
        archs = [a for a in archs if a not in uncached]
    recs, errors = [], []
    for i, res in enumerate(read_archives(archs, tmp / "cache", args.humaneval, args.workers)):
        recs.extend(r for r in res["recs"] if r["lang"] == "python")
        drops.update(res["drops"])
        if res.get("error"):
            errors.append((res["arch"]["source"], res["error"]))
        if i % 300 == 0:
            log(f"  {i}/{len(archs)} archives, {len(recs)} files")
    t_read = time.time()
    log(f"candidates: {len(recs)} files, {sum(r['bytes'] for r in recs) / 1e6:.0f} MB; errors {len(errors)}")
    existing = read_sha256s(args.existing_manifest)
    train, dedup_counts = dedup(recs, existing, read_sha256s(args.prior_manifest))
    del recs
    for r in train:
        r["sig"] = None  # MinHash signatures are not needed any more; they are most of the memory
    t_dedup = time.time()
    log(f"after dedup: {len(train)} files; {dict(dedup_counts)}")
    selected, sample_ratio = select(train, args.target_mib, drops)
    dest = args.out / args.shard_name
    # the xz streams are written in the shard's own folder: two builds side by side (03 and 04 from one
    # cache) once shared pyshard-tmp/p1-*.jsonl and mixed their selections
    written, ratios = write_shard(selected, dest, args.out, args.target_mib, args.max_mib)
    drops["select:over_budget"] += len(selected) - len(written)
    write_manifest(args.out / "manifest.jsonl.gz", written)
    total = sum(r["bytes"] for r in written)
    summary = {
        "total": {
            "files": len(written),
            "bytes": total,
            "chars": sum(len(r["text"]) for r in written),
            "est_tokens": int(total / 3.5),
            "projects": len({r["project"] for r in written}),
        },
        "shards": {args.shard_name: dest.stat().st_size},
        "per_language": aggregate(written, "lang"),
        **{f"per_{key}": aggregate(written, key) for key in ("license", "project", "source")},
        "drop_reasons": dict(drops.most_common()),
        "dedup": dict(dedup_counts.most_common()),
        "archive_errors": errors,
        "params": {
            "near_threshold": NEAR_THRESHOLD,
            "num_perm": cl.NUM_PERM,
            "bands": cl.BANDS,
            "shingle": "word 5-gram",
            "project_cap_frac": PROJECT_CAP_FRAC,
            "target_mib": args.target_mib,
            "max_mib": args.max_mib,
            "xz": "xz -9e -T1, concatenated streams",
            "sample_ratio": round(sample_ratio, 3),
            **ratios,
            "archives": len(archs),
            "prior_manifests": [str(p) for p in args.prior_manifest],
        },
        "seconds": {
            "read": round(t_read - t0),
            "dedup": round(t_dedup - t_read),
            "total": round(time.time() - t0),
        },
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    log("total", summary["total"], "shard bytes", dest.stat().st_size)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="stage", required=True)
    for name in ("fetch", "build"):
        p = sub.add_parser(name)
        p.add_argument("--packages", type=Path, default=HERE / "python_packages.txt")
        p.add_argument("--scratch", type=Path, default=Path("corpus-scratch"), help="downloads and cache")
    fp = sub.choices["fetch"]
    fp.add_argument(
        "--debian-mirror", default="http://deb.debian.org/debian", help="or a snapshot.debian.org URL"
    )
    bp = sub.choices["build"]
    bp.add_argument("--out", type=Path, required=True, help="directory for the shard, manifest and summary")
    bp.add_argument("--shard-name", required=True, help="e.g. train-05.jsonl.xz")
    bp.add_argument("--humaneval", type=Path, required=True, help="HumanEval jsonl.gz: decontamination only")
    bp.add_argument(
        "--existing-manifest",
        type=Path,
        action="append",
        default=[],
        help="manifest of a multilingual build: exact copies of its files are dropped (repeatable)",
    )
    bp.add_argument(
        "--prior-manifest",
        type=Path,
        action="append",
        default=[],
        help="manifest of an earlier Python shard: its files and their near duplicates are dropped (repeatable)",
    )
    bp.add_argument(
        "--cached-only", action="store_true", help="use only archives already read into the cache"
    )
    bp.add_argument("--workers", type=int, default=max(1, os.cpu_count() or 1))
    bp.add_argument("--target-mib", type=float, default=47.5, help="aimed compressed size of the shard")
    bp.add_argument("--max-mib", type=float, default=48.9, help="hard limit on the compressed size")
    args = ap.parse_args(argv)
    args.scratch = args.scratch.resolve()
    fetch(args) if args.stage == "fetch" else build(args)


if __name__ == "__main__":
    main()
