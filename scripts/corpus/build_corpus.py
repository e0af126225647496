#!/usr/bin/env python3
"""End-to-end builder of dfim's multilingual code corpus (training shards + held-out projects).

Why this exists: the embedded DiffusionGemma infilling model is retrained on
TypeScript/JavaScript, Go, Rust, Java and C/C++.  The only network this build
may use is the package registries, so the code comes from:

* npm tarballs (``npm pack``) of libraries that ship their ``src/*.ts``;
* Debian ``golang-*-dev`` / ``librust-*-dev`` binary packages (Go and Rust
  sources as shipped for Debian's own builds);
* Debian source packages (Java and C/C++ libraries, some JS projects).

Stages (each can be re-run; ``all`` runs both):

``fetch``  download everything listed in ``packages.txt`` into the scratch dir.
``build``  read the archives in memory, keep permissively licensed source files,
           filter generated/minified/vendored code, exact + MinHash near dedup,
           decontaminate against HumanEval, set aside held-out projects, and
           write ``train-NN.jsonl.xz``, ``summary.json``, ``manifest.jsonl.gz``
           and ``heldout/``.

``packages.txt`` lines: ``<kind> <name> [license=<SPDX>] [heldout=<group>]``
with kind in ``deb`` (binary .deb), ``deb-src`` (source package) or ``npm``.
``license=`` overrides the metadata (for packages whose debian/copyright is not
machine readable); ``heldout=`` puts the whole project in the held-out set.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import lzma
import multiprocessing as mp
import os
import random
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus_lib as cl  # noqa: E402

HERE = Path(__file__).resolve().parent
GROUPS = ["ts_js", "go", "rust", "java", "c_cpp"]
HELDOUT_GROUP_LANGS = {
    "ts_js": {"typescript"},
    "go": {"go"},
    "rust": {"rust"},
    "java": {"java"},
    "c_cpp": {"c", "cpp"},
}


def log(*a: Any) -> None:
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# packages.txt
# --------------------------------------------------------------------------


def read_packages(path: Path) -> list[dict[str, str]]:
    """Parse packages.txt into dicts {kind, name, license?, heldout?}."""
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        d = {"kind": parts[0], "name": parts[1]}
        for kv in parts[2:]:
            k, _, v = kv.partition("=")
            d[k] = v
        out.append(d)
    return out


# --------------------------------------------------------------------------
# fetch
# --------------------------------------------------------------------------


def apt_opts(scratch: Path, suite: str) -> list[str]:
    """apt-get options that use a private sources list/state, so the host's apt setup is untouched."""
    lst = scratch / f"sources-{suite}.list"
    lst.write_text(
        f"deb [trusted=yes] http://deb.debian.org/debian {suite} main\n"
        f"deb-src [trusted=yes] http://deb.debian.org/debian {suite} main\n"
    )
    (scratch / f"apt-lists-{suite}" / "partial").mkdir(parents=True, exist_ok=True)
    (scratch / "apt-cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    return [
        "-o",
        f"Dir::Etc::SourceList={lst}",
        "-o",
        "Dir::Etc::SourceParts=/dev/null",
        "-o",
        f"Dir::State::Lists={scratch}/apt-lists-{suite}",
        "-o",
        f"Dir::Cache={scratch}/apt-cache",
    ]


def fetch(args: argparse.Namespace) -> None:
    """Download debs, Debian source packages and npm tarballs into ``--scratch``."""
    scratch: Path = args.scratch
    scratch.mkdir(parents=True, exist_ok=True)
    pkgs = read_packages(args.packages)
    suites = args.suites.split(",")
    opts = {s: apt_opts(scratch, s) for s in suites}
    for s in suites:
        subprocess.run(["apt-get", *opts[s], "update"], check=True, stdout=subprocess.DEVNULL)
    debs = [p["name"] for p in pkgs if p["kind"] == "deb"]
    srcs = [p["name"] for p in pkgs if p["kind"] == "deb-src"]
    npms = [p["name"] for p in pkgs if p["kind"] == "npm"]
    pypis = [p["name"] for p in pkgs if p["kind"] == "pypi"]
    (scratch / "debs").mkdir(parents=True, exist_ok=True)
    (scratch / "src").mkdir(parents=True, exist_ok=True)
    (scratch / "npm").mkdir(parents=True, exist_ok=True)
    procs = []
    # binary debs: big batches, apt downloads them sequentially but fast
    batch = 200
    for i in range(0, len(debs), batch):
        procs.append(
            subprocess.Popen(
                ["apt-get", *opts[suites[0]], "download", *debs[i : i + batch]],
                cwd=scratch / "debs",
                stdout=subprocess.DEVNULL,
            )
        )
        if len(procs) >= 2:
            procs.pop(0).wait()
    # npm in parallel
    npm_p = subprocess.Popen(
        "xargs -P 6 -n 4 npm pack --silent < /dev/stdin",
        shell=True,
        cwd=scratch / "npm",
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert npm_p.stdin
    npm_p.stdin.write("\n".join(npms) + "\n")
    npm_p.stdin.close()
    # source packages: try each suite in order (the mirror may lack some files of a suite)
    for name in srcs:
        for s in suites:
            r = subprocess.run(
                ["apt-get", *opts[s], "source", "--download-only", name],
                cwd=scratch / "src",
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if r.returncode == 0:
                break
        else:
            log("source package not fetched:", name)
    (scratch / "pypi").mkdir(parents=True, exist_ok=True)
    for name in pypis:
        fetch_pypi_sdist(name, scratch / "pypi")
    for p in procs:
        p.wait()
    npm_p.wait()


def fetch_pypi_sdist(
    name: str, dest: Path, index: str = "https://pypi.org", version: str = "", filename: str = ""
) -> None:
    """Download an sdist of ``name`` via PyPI's JSON API (relative URLs resolved against the index).

    The newest by default; ``version`` (and ``filename``, when a release has several sdists) pin the
    one a recorded build used, so the build can be repeated.
    """
    import urllib.parse
    import urllib.request

    try:
        # The project's JSON lists every release: a registry proxy may serve it but not the per-version
        # JSON (`/pypi/NAME/VERSION/json` answered 404 here for releases that exist).
        meta_url = f"{index}/pypi/{name}/json"
        with urllib.request.urlopen(meta_url, timeout=60) as r:
            d = json.load(r)
        files = d.get("releases", {}).get(version, []) if version else d["urls"]
        url = next(
            (
                f["url"]
                for f in files
                if f["packagetype"] == "sdist" and (not filename or f["filename"] == filename)
            ),
            None,
        )
        if not url:
            log("no sdist:", name)
            return
        url = urllib.parse.urljoin(meta_url, url)
        out = dest / url.rsplit("/", 1)[-1]
        if not out.exists():
            with urllib.request.urlopen(url, timeout=120) as r:
                out.write_bytes(r.read())
    except Exception as e:  # network hiccup: the build just works with what is there
        log("pypi fetch failed:", name, e)


# --------------------------------------------------------------------------
# archive -> candidate files (runs in worker processes)
# --------------------------------------------------------------------------

_HE_SIGS: list[str] = []
_HE_NAMES: frozenset[str] = frozenset()


def _init_worker(he_sigs: list[str], he_names: list[str]) -> None:
    global _HE_SIGS, _HE_NAMES
    _HE_SIGS = he_sigs
    _HE_NAMES = frozenset(he_names)


def _decontam(text: str) -> str | None:
    if "def " in text:
        for s in _HE_SIGS:
            if s in text:
                return "decontam:humaneval_signature"
    if _HE_NAMES:
        hits = _HE_NAMES.intersection(cl._WORD.findall(text)) if any(n in text for n in _HE_NAMES) else ()
        if len(hits) >= 3:
            return "decontam:humaneval_names"
    return None


def _read_members(arch: dict[str, Any], max_bytes: int) -> tuple[dict[str, bytes], dict[str, bytes], str]:
    """Return (source-ish files relpath->bytes, meta files, version) of one archive."""
    kind = arch["kind"]
    files: dict[str, bytes] = {}
    meta: dict[str, bytes] = {}
    version = arch.get("version", "")

    def want(rel: str) -> bool:
        return cl.lang_of(rel) is not None

    def is_meta(rel: str) -> bool:
        b = rel.rsplit("/", 1)[-1].lower()
        return b in ("package.json", "cargo.toml", "copyright", "pkg-info") or b.startswith(
            ("license", "licence", "copying")
        )

    if kind in ("npm", "pypi"):
        tf = cl.open_tar_bytes(arch["files"][0], Path(arch["files"][0]).read_bytes())
        for name, data in cl.iter_tar_files(tf, max_bytes):
            rel = name.split("/", 1)[1] if "/" in name else name
            if want(rel):
                files[rel] = data
            elif is_meta(rel) and rel.count("/") == 0:
                meta[rel] = data
    elif kind == "deb":
        raw = Path(arch["files"][0]).read_bytes()
        for mname, mdata in cl.iter_ar(raw):
            if mname.startswith("data.tar"):
                tf = cl.open_tar_bytes(mname, mdata)
                for name, data in cl.iter_tar_files(tf, max_bytes):
                    name = name.lstrip("./")
                    if name.startswith("usr/share/doc/") and name.endswith("/copyright"):
                        meta["debian/copyright"] = data
                    elif name.startswith("usr/share/gocode/src/"):
                        rel = name[len("usr/share/gocode/src/") :]
                        if want(rel):
                            files[rel] = data
                        elif is_meta(rel):
                            meta[rel] = data
                    elif name.startswith("usr/share/cargo/registry/"):
                        rel = name[len("usr/share/cargo/registry/") :]
                        if want(rel):
                            files[rel] = data
                        elif is_meta(rel):
                            meta[rel] = data
    elif kind == "deb-src":
        for f in arch["files"]:
            base = Path(f).name
            comp = ""
            m = re.search(r"\.orig-([A-Za-z0-9-]+)\.tar\.", base)
            if m:
                comp = m.group(1) + "/"
            is_debian = ".debian.tar." in base
            is_native = not is_debian and ".orig" not in base
            tf = cl.open_tar_bytes(base, Path(f).read_bytes())
            for name, data in cl.iter_tar_files(tf, max_bytes):
                rel = name.split("/", 1)[1] if "/" in name else name
                if is_debian:
                    if name in ("debian/copyright", "./debian/copyright"):
                        meta["debian/copyright"] = data
                    continue
                if is_native and rel == "debian/copyright":
                    meta["debian/copyright"] = data
                    continue
                if is_native and rel.startswith("debian/"):
                    continue
                rel = comp + rel
                if want(rel):
                    files[rel] = data
                elif is_meta(rel) and rel.count("/") <= 1:
                    meta[rel] = data
    return files, meta, version


def _licence_resolver(arch: dict[str, Any], files: dict[str, bytes], meta: dict[str, bytes]):
    """Build a function relpath -> permissive licence label (or None)."""
    override = arch.get("license")
    if override:
        lab = cl.norm_licence(override)
        return lambda rel: lab
    kind = arch["kind"]
    if kind == "npm":
        lab = None
        try:
            pj = json.loads(meta.get("package.json", b"{}"))
            lic = pj.get("license") or pj.get("licenses")
            if isinstance(lic, dict):
                lic = lic.get("type")
            if isinstance(lic, list):
                lic = " OR ".join(x.get("type", "") if isinstance(x, dict) else str(x) for x in lic)
            lab = cl.norm_licence(str(lic)) if lic else None
        except Exception:
            lab = None
        if lab is None:
            for k, v in meta.items():
                if k.lower().startswith(("license", "licence")):
                    lab = cl.guess_licence_from_text(v.decode("utf-8", "replace"))
                    break
        return lambda rel: lab
    if kind == "pypi":
        lab = None
        info = meta.get("PKG-INFO", b"").decode("utf-8", "replace")
        m = re.search(r"^License-Expression:\s*(.+)$", info, re.M)
        if m:
            lab = cl.norm_licence(m.group(1))
        if lab is None:
            m = re.search(r"^License:\s*(.{1,60})$", info, re.M)
            lab = cl.norm_licence(m.group(1)) if m else None
        if lab is None:
            cls = re.findall(r"^Classifier: License :: OSI Approved :: (.+)$", info, re.M)
            names = [cl.norm_licence(c.replace(" License", "").replace("Software", "").strip()) for c in cls]
            lab = next((n for n in names if n), None)
        if lab is None:
            for k, v in meta.items():
                if k.lower().startswith(("license", "licence", "copying")):
                    lab = cl.guess_licence_from_text(v.decode("utf-8", "replace"))
                    break
        return lambda rel: lab
    dep5 = cl.parse_dep5(meta.get("debian/copyright", b"").decode("utf-8", "replace"))
    # Rust crates: Cargo.toml of each crate dir is authoritative
    cargo: dict[str, str | None] = {}
    for k, v in meta.items():
        if k.endswith("Cargo.toml") and k.count("/") == 1:
            m = re.search(r'^license\s*=\s*"([^"]+)"', v.decode("utf-8", "replace"), re.M)
            cargo[k.split("/")[0]] = cl.norm_licence(m.group(1)) if m else None
    # top-level LICENSE files as a fallback for non-DEP-5 copyright files
    top_guess: str | None = None
    for k, v in sorted(meta.items(), key=lambda kv: kv[0].count("/")):
        if k.rsplit("/", 1)[-1].lower().startswith(("license", "licence", "copying")):
            g = cl.guess_licence_from_text(v.decode("utf-8", "replace"))
            if g:
                top_guess = g
                break
    # Go: DEP-5 globs are relative to the import-path root
    go_root = ""
    if arch["kind"] == "deb" and any(r.endswith(".go") for r in files):
        dirs = [r.split("/")[:-1] for r in files]
        common = dirs[0]
        for d in dirs[1:]:
            i = 0
            while i < min(len(common), len(d)) and common[i] == d[i]:
                i += 1
            common = common[:i]
        go_root = "/".join(common) + "/" if common else ""

    def resolve(rel: str) -> str | None:
        top = rel.split("/", 1)[0]
        if top in cargo and cargo[top]:
            return cargo[top]
        if dep5.is_dep5:
            r = rel[len(go_root) :] if go_root and rel.startswith(go_root) else rel
            if top in cargo:
                r = rel.split("/", 1)[1] if "/" in rel else rel
            raw = dep5.licence_for(r)
            return cl.norm_licence(raw) if raw else None
        return top_guess

    return resolve


def process_archive(arch: dict[str, Any]) -> dict[str, Any]:
    """Read one archive and return candidate records plus drop counts (worker entry point)."""
    drops: Counter = Counter()
    recs: list[dict[str, Any]] = []
    try:
        files, meta, version = _read_members(arch, 600_000)
    except Exception as e:  # corrupt/partial download
        return {"arch": arch, "recs": [], "drops": {"archive_error": 1}, "error": repr(e)}
    resolve = _licence_resolver(arch, files, meta)
    project = arch["project"]
    # .h headers belong to C++ when the project is mostly C++
    n_cpp = sum(1 for r in files if cl.lang_of(r) == "cpp")
    n_c = sum(1 for r in files if r.lower().endswith(".c"))
    h_lang = "cpp" if n_cpp > n_c else "c"
    # In a TypeScript project, a .js next to a same-named .d.ts is tsc output, not source.
    has_ts_src = any(r.endswith((".ts", ".tsx")) and not r.endswith(".d.ts") for r in files)
    dts_stems = {re.sub(r"\.d\.[cm]?ts$", "", r) for r in files if re.search(r"\.d\.[cm]?ts$", r)}
    for rel, data in sorted(files.items()):
        lang = cl.lang_of(rel)
        if lang is None:
            continue
        if lang == "javascript" and has_ts_src and re.sub(r"\.[cm]?jsx?$", "", rel) in dts_stems:
            drops["content:compiled_js_next_to_dts"] += 1
            continue
        if lang == "python" and not arch.get("python"):
            continue
        if arch.get("python_only") and lang != "python":
            continue  # a Python shard keeps only the Python files of a mixed-language project
        if lang == "c" and rel.lower().endswith(".h"):
            lang = h_lang
        reason = cl.path_reject(rel)
        if reason is None:
            lic = resolve(rel)
            if lic is None:
                reason = "license:not_permissive_or_unknown"
        if reason is None:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                reason = "encoding:not_utf8"
        if reason is None:
            text = text.replace("\r\n", "\n")
            reason = cl.content_reject(text, lang, len(data)) or _decontam(text)
        if reason:
            drops[reason] += 1
            continue
        sig = cl.minhash(text)
        recs.append(
            {
                "text": text,
                "path": f"{project}/{rel}",
                "lang": lang,
                "license": lic,
                "source": arch["source"],
                "project": project,
                "group": cl.LANG_GROUP[lang],
                "sha": cl.norm_sha(text),
                "bytes": len(text.encode()),
                "sig": sig,
                "heldout": arch.get("heldout"),
                "dts": rel.endswith(".d.ts"),
            }
        )
    return {"arch": arch, "recs": recs, "drops": dict(drops)}


# --------------------------------------------------------------------------
# archive discovery
# --------------------------------------------------------------------------


def discover(scratch: Path, pkgs: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Find downloaded archives and attach packages.txt options (licence override, held-out)."""
    by_name = {(p["kind"], p["name"]): p for p in pkgs}
    archs: list[dict[str, Any]] = []
    for deb in sorted((scratch / "debs").rglob("*.deb")):
        name, ver = deb.name.split("_")[:2]
        p = by_name.get(("deb", name))
        if p is None:
            continue
        proj = re.sub(r"-dev$", "", name)
        proj = re.sub(r"^librust-", "rust-", proj)
        archs.append(
            {
                "kind": "deb",
                "files": [str(deb)],
                "project": proj,
                "version": ver,
                "source": f"deb:{name}_{ver.replace('%3a', ':')}",
                **{k: v for k, v in p.items() if k not in ("kind", "name")},
            }
        )
    # source packages: newest complete .dsc per source name
    best: dict[str, tuple[float, Path, list[Path]]] = {}
    for dsc in (scratch / "src").rglob("*.dsc"):
        txt = dsc.read_text(errors="replace")
        m = re.search(r"^Files:\s*\n((?:[ \t].*\n?)+)", txt, re.M)
        if not m:
            continue
        parts = [dsc.parent / line.split()[-1] for line in m.group(1).strip().splitlines()]
        if not all(p.exists() for p in parts):
            continue
        src = dsc.name.split("_")[0]
        mt = dsc.stat().st_mtime
        if src not in best or mt > best[src][0]:
            best[src] = (mt, dsc, parts)
    for src, (_, dsc, parts) in sorted(best.items()):
        p = by_name.get(("deb-src", src))
        if p is None:
            continue
        ver = dsc.stem.split("_", 1)[1]
        archs.append(
            {
                "kind": "deb-src",
                "files": [
                    str(x) for x in parts if ".tar." in x.name and not x.name.endswith((".asc", ".sig"))
                ],
                "project": src,
                "version": ver,
                "source": f"deb-src:{src}_{ver}",
                **{k: v for k, v in p.items() if k not in ("kind", "name")},
            }
        )
    npm_opts = {p["name"]: p for p in pkgs if p["kind"] == "npm"}
    for tgz in sorted((scratch / "npm").glob("*.tgz")):
        try:
            import tarfile

            with tarfile.open(tgz) as tf:
                m = tf.getmember("package/package.json")
                pj = json.loads(tf.extractfile(m).read())  # type: ignore[union-attr]
        except Exception:
            continue
        name, ver = pj.get("name", tgz.stem), pj.get("version", "")
        if name not in npm_opts:
            continue
        archs.append(
            {
                "kind": "npm",
                "files": [str(tgz)],
                "project": name.replace("/", "__").lstrip("@"),
                "version": ver,
                "source": f"npm:{name}@{ver}",
                **{k: v for k, v in npm_opts[name].items() if k not in ("kind", "name")},
            }
        )
    py_opts = {p["name"].lower(): p for p in pkgs if p["kind"] == "pypi"}
    for sd in sorted((scratch / "pypi").glob("*.tar.gz")):
        m = re.match(r"(.+?)-(\d[^-]*)\.tar\.gz$", sd.name)
        if not m or m.group(1).lower().replace("_", "-") not in py_opts:
            continue
        name, ver = m.group(1).lower().replace("_", "-"), m.group(2)
        archs.append(
            {
                "kind": "pypi",
                "files": [str(sd)],
                "project": f"py-{name}",
                "version": ver,
                "source": f"pypi:{name}=={ver}",
                "python": True,
                **{k: v for k, v in py_opts[name].items() if k not in ("kind", "name")},
            }
        )
    return archs


# --------------------------------------------------------------------------
# build
# --------------------------------------------------------------------------


def load_humaneval(path: Path) -> tuple[list[str], list[str]]:
    """HumanEval ``def entry_point(...)`` signature lines and distinctive entry-point names."""
    sigs, names = set(), set()
    for line in gzip.open(path, "rt"):
        d = json.loads(line)
        ep = d["entry_point"]
        for line in d["prompt"].splitlines():
            if line.strip().startswith(f"def {ep}("):
                sigs.add(line.strip())
        if "_" in ep and len(ep) >= 10:
            names.add(ep)
    return sorted(sigs), sorted(names)


class UF:
    """Union-find over record indices (near-duplicate clusters)."""

    def __init__(self, n: int) -> None:
        self.p = list(range(n))

    def find(self, x: int) -> int:
        while self.p[x] != x:
            self.p[x] = self.p[self.p[x]]
            x = self.p[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.p[max(ra, rb)] = min(ra, rb)


def build(args: argparse.Namespace) -> None:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    pkgs = read_packages(args.packages)
    archs = discover(args.scratch, pkgs)
    log(f"{len(archs)} archives")
    he_sigs, he_names = load_humaneval(args.humaneval)
    # big archives first so the pool stays busy
    archs.sort(key=lambda a: -sum(os.path.getsize(f) for f in a["files"]))
    recs: list[dict[str, Any]] = []
    drops: Counter = Counter()
    errors = []
    with mp.Pool(args.workers, initializer=_init_worker, initargs=(he_sigs, he_names)) as pool:
        for i, res in enumerate(pool.imap_unordered(process_archive, archs, chunksize=1)):
            recs.extend(res["recs"])
            drops.update(res["drops"])
            if res.get("error"):
                errors.append((res["arch"]["source"], res["error"]))
            if i % 500 == 0:
                log(
                    f"  {i}/{len(archs)} archives, {len(recs)} files, {sum(r['bytes'] for r in recs) / 1e6:.0f} MB"
                )
    log(f"candidates: {len(recs)} files, {sum(r['bytes'] for r in recs) / 1e6:.0f} MB; errors {len(errors)}")

    # deterministic order: held-out first (so they win every dedup), then by source/path
    recs.sort(key=lambda r: (r["heldout"] is None, r["source"], r["path"]))
    n = len(recs)
    keep = [True] * n
    dedup: Counter = Counter()
    # ---- exact dedup
    seen: dict[str, int] = {}
    for i, r in enumerate(recs):
        j = seen.get(r["sha"])
        if j is None:
            seen[r["sha"]] = i
            continue
        if r["heldout"] is not None and recs[j]["heldout"] is not None:
            continue  # keep held-out projects whole
        keep[i] = False
        dedup["exact_duplicate" if recs[j]["heldout"] is None else "exact_duplicate_of_heldout"] += 1
    # ---- near dedup (MinHash LSH, star comparison against the bucket's first member)
    uf = UF(n)
    buckets: dict[bytes, int] = {}
    for i, r in enumerate(recs):
        if not keep[i] or r["sig"] is None:
            continue
        for key in cl.lsh_keys(r["sig"]):
            j = buckets.get(key)
            if j is None:
                buckets[key] = i
            elif uf.find(i) != uf.find(j) and cl.jaccard_est(r["sig"], recs[j]["sig"]) >= args.near_threshold:
                uf.union(i, j)
    del buckets
    clusters: dict[int, list[int]] = defaultdict(list)
    for i in range(n):
        if keep[i] and recs[i]["sig"] is not None:
            clusters[uf.find(i)].append(i)
    for members in clusters.values():
        if len(members) < 2:
            continue
        has_heldout = any(recs[m]["heldout"] is not None for m in members)
        first = min(members)
        for m in members:
            if recs[m]["heldout"] is not None:
                continue
            if has_heldout:
                keep[m] = False
                dedup["near_duplicate_of_heldout"] += 1
            elif m != first:
                keep[m] = False
                dedup["near_duplicate"] += 1
    heldout = [
        r
        for i, r in enumerate(recs)
        if keep[i]
        and r["heldout"] is not None
        and r["lang"] in HELDOUT_GROUP_LANGS[r["heldout"]]
        and not r["dts"]
    ]
    train = [r for i, r in enumerate(recs) if keep[i] and r["heldout"] is None]
    log(
        f"after dedup: train {len(train)} files {sum(r['bytes'] for r in train) / 1e6:.0f} MB; heldout {len(heldout)}"
    )
    write_heldout(out, heldout, archs)

    # ---- selection to the compressed budget
    selected, sel_drops = select(train, args)
    drops.update(sel_drops)
    write_outputs(out, selected, drops, dedup, args, errors)


def select(train: list[dict[str, Any]], args: argparse.Namespace) -> tuple[list[dict[str, Any]], Counter]:
    """Pick files so each language group gets ~equal compressed bytes and no project dominates."""
    drops: Counter = Counter()
    rnd = random.Random(1234)
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in train:
        by_group[r["group"]].append(r)
    # cap .d.ts at 5% of TypeScript bytes
    ts_bytes = sum(r["bytes"] for r in by_group["ts_js"] if r["lang"] == "typescript" and not r["dts"])
    dts_left = 0.05 * ts_bytes
    kept_ts = []
    for r in sorted(by_group["ts_js"], key=lambda r: r["sha"]):
        if r["dts"]:
            if dts_left < r["bytes"]:
                drops["select:dts_share_cap"] += 1
                continue
            dts_left -= r["bytes"]
        kept_ts.append(r)
    by_group["ts_js"] = kept_ts
    # compression ratio per group from a sample
    ratio: dict[str, float] = {}
    for g, rs in by_group.items():
        sample = rnd.sample(rs, min(len(rs), 3000))
        blob = "\n".join(cl.dumps({"text": r["text"], "path": r["path"]}) for r in sample).encode()[
            :6_000_000
        ]
        ratio[g] = len(blob) / max(1, len(lzma.compress(blob, preset=9 | lzma.PRESET_EXTREME)))
    log("xz ratios:", {g: round(v, 2) for g, v in ratio.items()})
    budget_c = args.shards * args.shard_mib * 2**20 * args.fill  # compressed bytes to fill
    groups = [g for g in by_group if g != "python"]
    avail_c = {g: sum(r["bytes"] for r in by_group[g]) / ratio[g] for g in groups}
    # water-filling: equal compressed share, leftovers to groups that have more
    alloc: dict[str, float] = {}
    remaining, todo = (
        budget_c
        - min(args.python_mb * 1e6, sum(r["bytes"] for r in by_group.get("python", [])))
        / ratio.get("python", 5),
        set(groups),
    )
    while todo:
        share = remaining / len(todo)
        small = [g for g in todo if avail_c[g] <= share]
        if not small:
            for g in todo:
                alloc[g] = share
            break
        for g in small:
            alloc[g] = avail_c[g]
            remaining -= avail_c[g]
            todo.discard(g)
    selected = []
    # Python is covered elsewhere; only a small, per-project-capped slice from PyPI sdists
    py_used, py_proj = 0, Counter()
    for r in sorted(by_group.get("python", []), key=lambda r: hashlib.md5(r["sha"].encode()).hexdigest()):
        if py_used + r["bytes"] > args.python_mb * 1e6 or py_proj[r["project"]] + r["bytes"] > 1.5e6:
            drops["select:python_cap"] += 1
            continue
        py_used += r["bytes"]
        py_proj[r["project"]] += r["bytes"]
        selected.append(r)
    for g in groups:
        raw_budget = alloc[g] * ratio[g]
        rs = by_group[g]
        proj_cap = max(args.project_cap_frac * raw_budget, 2_000_000)
        proj_used: Counter = Counter()
        used = 0
        for r in sorted(rs, key=lambda r: hashlib.md5(r["sha"].encode()).hexdigest()):
            if used + r["bytes"] > raw_budget:
                drops["select:over_budget"] += 1
                continue
            if proj_used[r["project"]] + r["bytes"] > proj_cap:
                drops["select:project_cap"] += 1
                continue
            proj_used[r["project"]] += r["bytes"]
            used += r["bytes"]
            selected.append(r)
        log(
            f"  {g}: {used / 1e6:.1f} MB raw of {sum(r['bytes'] for r in rs) / 1e6:.1f} MB (alloc {alloc[g] / 2**20:.1f} MiB xz)"
        )
    return selected, drops


def write_heldout(out: Path, heldout: list[dict[str, Any]], archs: list[dict[str, Any]]) -> None:
    """Write held-out projects as plain files plus a README listing them."""
    hd = out / "heldout"
    if hd.exists():
        shutil.rmtree(hd)
    info: dict[tuple[str, str], dict[str, Any]] = {}
    for r in heldout:
        dest = hd / r["heldout"] / r["path"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(r["text"])
        k = (r["heldout"], r["project"])
        d = info.setdefault(
            k, {"files": 0, "bytes": 0, "licenses": Counter(), "source": r["source"], "langs": Counter()}
        )
        d["files"] += 1
        d["bytes"] += r["bytes"]
        d["licenses"][r["license"]] += 1
        d["langs"][r["lang"]] += 1
    hd.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Held-out projects",
        "",
        "Whole projects kept out of the training shards (and every training file that is an exact",
        "or MinHash near-duplicate, Jaccard >= 0.85, of any of their files was removed from training).",
        "Only source files of the project's language, after the same quality filters as training.",
        "Use them to measure line completion on code the model never saw.",
        "",
        "| group | project (dir) | version / source | licence | files | bytes | languages |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (g, p), d in sorted(info.items()):
        lic = ", ".join(f"{k}" for k, _ in d["licenses"].most_common())
        langs = ", ".join(f"{k}: {v}" for k, v in d["langs"].most_common())
        lines.append(f"| {g} | {p} | `{d['source']}` | {lic} | {d['files']} | {d['bytes']} | {langs} |")
    lines += [
        "",
        "Sources: `npm:` = npm registry tarball, `deb:` = Debian bookworm binary package,",
        "`deb-src:` = Debian source package (bookworm, trixie where bookworm's was unavailable).",
        "",
    ]
    (hd / "README.md").write_text("\n".join(lines))
    log(f"heldout: {len(info)} projects, {len(heldout)} files")


def write_outputs(
    out: Path,
    selected: list[dict[str, Any]],
    drops: Counter,
    dedup: Counter,
    args: argparse.Namespace,
    errors: list,
) -> None:
    """Shards (xz -9e, shuffled by hash), manifest and summary."""
    for old in out.glob("train-*.jsonl.xz"):
        old.unlink()
    shards: list[list[dict[str, Any]]] = [[] for _ in range(args.shards)]
    for r in sorted(
        selected, key=lambda r: hashlib.sha1(("shuffle" + r["sha"] + r["path"]).encode()).hexdigest()
    ):
        shards[int(r["sha"][:8], 16) % args.shards].append(r)
    with gzip.open(out / "manifest.jsonl.gz", "wt") as f:
        for r in sorted(selected, key=lambda r: r["path"]):
            f.write(
                json.dumps(
                    {
                        "path": r["path"],
                        "lang": r["lang"],
                        "license": r["license"],
                        "source": r["source"],
                        "sha256": hashlib.sha256(r["text"].encode()).hexdigest(),
                        "bytes": r["bytes"],
                    }
                )
                + "\n"
            )

    def agg(key: str) -> dict[str, Any]:
        d: dict[str, dict[str, float]] = defaultdict(lambda: {"files": 0, "bytes": 0})
        for r in selected:
            d[r[key]]["files"] += 1
            d[r[key]]["bytes"] += r["bytes"]
        return {
            k: {**v, "est_tokens": int(v["bytes"] / 3.5)}
            for k, v in sorted(d.items(), key=lambda kv: -kv[1]["bytes"])
        }

    summary = {
        "total": {
            "files": len(selected),
            "bytes": sum(r["bytes"] for r in selected),
            "est_tokens": int(sum(r["bytes"] for r in selected) / 3.5),
            "projects": len({r["project"] for r in selected}),
        },
        "shards": {},
        "per_language": agg("lang"),
        "per_group": agg("group"),
        "per_license": agg("license"),
        "per_source": agg("source"),
        "drop_reasons": dict(drops.most_common()),
        "dedup": dict(dedup.most_common()),
        "archive_errors": errors,
        "params": {
            "near_threshold": args.near_threshold,
            "num_perm": cl.NUM_PERM,
            "bands": cl.BANDS,
            "shingle": "word 5-gram",
            "shards": args.shards,
            "shard_mib": args.shard_mib,
            "fill": args.fill,
        },
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    log("total", summary["total"])
    # compress last (slow), then record the shard sizes
    tmp = args.scratch / "shards"
    tmp.mkdir(parents=True, exist_ok=True)
    procs = []
    for k, sh in enumerate(shards):
        raw = tmp / f"train-{k:02d}.jsonl"
        with raw.open("w") as f:
            for r in sh:
                f.write(
                    cl.dumps(
                        {
                            "text": r["text"],
                            "path": r["path"],
                            "lang": r["lang"],
                            "license": r["license"],
                            "source": r["source"],
                        }
                    )
                    + "\n"
                )
        dest = out / f"train-{k:02d}.jsonl.xz"
        procs.append(
            (dest, subprocess.Popen(f"xz -9e -c -T1 {raw} > {dest}.tmp && mv {dest}.tmp {dest}", shell=True))
        )
    sizes = {}
    for dest, p in procs:
        if p.wait() != 0:
            raise SystemExit(f"xz failed for {dest}")
        sizes[dest.name] = dest.stat().st_size
        log(f"{dest.name}: {sizes[dest.name] / 2**20:.2f} MiB")
        if sizes[dest.name] > 54 * 2**20:
            log(f"WARNING {dest.name} is over 54 MiB; rerun with a smaller --fill")
    summary["shards"] = sizes
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["fetch", "build", "all"])
    ap.add_argument("--packages", type=Path, default=HERE / "packages.txt")
    ap.add_argument("--scratch", type=Path, default=Path("corpus-scratch"), help="download/scratch directory")
    ap.add_argument("--out", type=Path, default=Path(".corpus"), help="output directory")
    ap.add_argument(
        "--humaneval",
        type=Path,
        default=Path("shared/data/humaneval-infilling/HumanEval-SingleLineInfilling.jsonl.gz"),
    )
    ap.add_argument("--suites", default="bookworm,trixie", help="Debian suites to try, in order")
    ap.add_argument("--workers", type=int, default=max(1, os.cpu_count() or 1))
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--shard-mib", type=float, default=54.0, help="hard limit per compressed shard")
    ap.add_argument(
        "--fill",
        type=float,
        default=0.93,
        help="fraction of the shard limit to aim for (xz ratio is estimated)",
    )
    ap.add_argument("--python-mb", type=float, default=20.0, help="raw MB of Python (PyPI sdists) to include")
    ap.add_argument("--near-threshold", type=float, default=0.85)
    ap.add_argument(
        "--project-cap-frac", type=float, default=0.04, help="max share of a group's budget from one project"
    )
    args = ap.parse_args()
    if args.stage in ("fetch", "all"):
        fetch(args)
    if args.stage in ("build", "all"):
        build(args)


if __name__ == "__main__":
    main()
