"""The Python shard builder (scripts/corpus/build_python_shard.py) on tiny synthetic archives.

One Debian source package and three PyPI sdists are written as real tarballs in a scratch folder
laid out as `fetch` leaves it, and the real `build` runs on them (worker pool, xz, manifest, summary).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import lzma
import random
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "corpus" / "build_python_shard.py"
MIT = "Permission is hereby granted, free of charge, to any person obtaining a copy of this software.\n"
DEP5 = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: alpha

Files: *
Copyright: 2024 Alpha Authors
License: MIT

Files: alpha/copyleft.py
Copyright: 2024 Someone Else
License: GPL-3+
"""
# A made-up evaluation task: the builder drops any file that contains its signature line.
EVAL_SIGNATURE = "def count_vowel_runs_between(text: str, start: int) -> int:"


def module_code(seed: int, lines: int = 60) -> str:
    """Plausible Python whose word 5-grams are unique to ``seed`` (no accidental near duplicates)."""
    rnd = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "total", "value", "count", "index", "item", "name", "key"]
    out = [f'"""Module {seed}: helpers."""', ""]
    for i in range(lines // 3):
        a, b = rnd.sample(words, 2)
        out += [
            f"def {a}_{b}_{seed}_{i}({a}, {b}_{rnd.randrange(999)}):",
            f"    return {a} + {rnd.randrange(10**6)}",
            "",
        ]
    return "\n".join(out) + "\n"


def near_copy(text: str) -> str:
    """The same file with one line edited: Jaccard of word 5-grams stays far above 0.85."""
    lines = text.split("\n")
    lines[4] = lines[4] + "  # edited"
    return "\n".join(lines)


def write_tar(path: Path, members: dict[str, str]) -> None:
    mode = "w:xz" if path.name.endswith(".xz") else "w:gz"
    with tarfile.open(path, mode) as tf:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def pkg_info(name: str, licence: str) -> str:
    return f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\nLicense: {licence}\n"


@pytest.fixture(scope="module")
def shard_module():
    spec = importlib.util.spec_from_file_location("build_python_shard", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_python_shard"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    prior = module_code(1)
    in_multilingual = module_code(7)
    return {
        "alpha_core": module_code(2),
        "alpha_copyleft": module_code(3),
        "alpha_near_prior": near_copy(prior),
        "alpha_eval": module_code(4).replace('"""Module 4: helpers."""', f"{EVAL_SIGNATURE}\n    return 0\n"),
        "beta_prior": prior,
        "beta_mod": module_code(5),
        "beta_multilingual": in_multilingual,
        "beta_near_multilingual": near_copy(in_multilingual),
        "gamma_mod": module_code(6),
        "alpha_js": "export function widget(a) {\n  return a + 1;\n}\n" * 10,
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory, shard_module, texts):
    """Scratch with downloads, the manifests of earlier builds, and one `build` run over them."""
    root = tmp_path_factory.mktemp("pyshard")
    scratch, out = root / "scratch", root / "out"
    (scratch / "src" / "py").mkdir(parents=True)
    (scratch / "pypi-py").mkdir()
    write_tar(
        scratch / "src" / "py" / "python-alpha_1.0.orig.tar.gz",
        {
            "alpha-1.0/LICENSE": MIT,
            "alpha-1.0/alpha/core.py": texts["alpha_core"],
            "alpha-1.0/alpha/copyleft.py": texts["alpha_copyleft"],
            "alpha-1.0/alpha/near_prior.py": texts["alpha_near_prior"],
            "alpha-1.0/alpha/evalish.py": texts["alpha_eval"],
            "alpha-1.0/alpha/static/widget.js": texts["alpha_js"],  # a Python shard keeps Python only
        },
    )
    write_tar(scratch / "src" / "py" / "python-alpha_1.0-1.debian.tar.xz", {"debian/copyright": DEP5})
    write_tar(
        scratch / "pypi-py" / "beta-2.0.tar.gz",
        {
            "beta-2.0/PKG-INFO": pkg_info("beta", "BSD-3-Clause"),
            "beta-2.0/beta/prior.py": texts["beta_prior"],
            "beta-2.0/beta/mod.py": texts["beta_mod"],
            "beta-2.0/beta/multilingual.py": texts["beta_multilingual"],
            "beta-2.0/beta/near_multilingual.py": texts["beta_near_multilingual"],
        },
    )
    write_tar(
        scratch / "pypi-py" / "gamma-0.1.tar.gz",
        {
            "gamma-0.1/PKG-INFO": pkg_info("gamma", "GPL-3.0-only"),
            "gamma-0.1/gamma/mod.py": texts["gamma_mod"],
        },
    )
    packages = root / "python_packages.txt"
    packages.write_text(
        "# test list\n"
        "deb-src python-alpha version=1.0-1 files=python-alpha_1.0.orig.tar.gz,python-alpha_1.0-1.debian.tar.xz\n"
        "pypi beta version=2.0 files=beta-2.0.tar.gz\n"
        "pypi gamma version=0.1 files=gamma-0.1.tar.gz\n"
        "pypi never-downloaded version=3.0 files=never_downloaded-3.0.tar.gz\n"
    )
    humaneval = root / "eval.jsonl.gz"
    with gzip.open(humaneval, "wt") as f:
        task = {"prompt": f"{EVAL_SIGNATURE}\n    pass\n", "entry_point": "count_vowel_runs_between"}
        f.write(json.dumps(task) + "\n")

    def manifest(path: Path, text: str) -> Path:
        with gzip.open(path, "wt") as f:
            f.write(
                json.dumps({"path": "x/y.py", "sha256": hashlib.sha256(text.encode()).hexdigest()}) + "\n"
            )
        return path

    prior = manifest(root / "manifest-prior.jsonl.gz", texts["beta_prior"])
    existing = manifest(root / "manifest-multilingual.jsonl.gz", texts["beta_multilingual"])
    shard_module.main(
        [
            "build",
            "--packages",
            str(packages),
            "--scratch",
            str(scratch),
            "--out",
            str(out),
            "--shard-name",
            "train-09.jsonl.xz",
            "--humaneval",
            str(humaneval),
            "--existing-manifest",
            str(existing),
            "--prior-manifest",
            str(prior),
            "--workers",
            "1",
        ]
    )
    return out


def shard_records(out: Path) -> list[dict]:
    with lzma.open(out / "train-09.jsonl.xz", "rt") as f:
        return [json.loads(line) for line in f]


def paths(out: Path) -> set[str]:
    return {r["path"] for r in shard_records(out)}


def test_a_prior_shard_file_and_its_near_duplicate_are_not_written(built):
    assert "py-beta/beta/prior.py" not in paths(built)
    assert "python-alpha/alpha/near_prior.py" not in paths(built)
    assert json.loads((built / "summary.json").read_text())["dedup"]["in_prior_shard"] == 1


def test_a_multilingual_shard_file_is_dropped_but_not_its_near_duplicate(built):
    # the multilingual shards' texts are not at hand, so only exact copies can be recognised
    assert "py-beta/beta/multilingual.py" not in paths(built)
    assert "py-beta/beta/near_multilingual.py" in paths(built)


def test_a_file_with_an_evaluation_signature_is_dropped(built):
    assert "python-alpha/alpha/evalish.py" not in paths(built)
    drops = json.loads((built / "summary.json").read_text())["drop_reasons"]
    assert drops["decontam:humaneval_signature"] == 1


def test_licences_are_per_file_and_only_permissive_ones_are_kept(built):
    by_path = {r["path"]: r["license"] for r in shard_records(built)}
    assert by_path["python-alpha/alpha/core.py"] == "MIT"  # debian/copyright's `Files: *`
    assert "python-alpha/alpha/copyleft.py" not in by_path  # its own GPL stanza
    assert by_path["py-beta/beta/mod.py"] == "BSD-3-Clause"  # PKG-INFO
    assert not any(p.startswith("py-gamma/") for p in by_path)  # a GPL sdist
    assert by_path.keys() == {
        "python-alpha/alpha/core.py",
        "py-beta/beta/mod.py",
        "py-beta/beta/near_multilingual.py",
    }


def test_the_shard_is_xz_jsonl_matching_its_manifest_and_summary(built, texts):
    records = shard_records(built)
    assert all(set(r) == {"text", "path", "lang", "license", "source"} for r in records)
    assert {r["lang"] for r in records} == {"python"}
    by_path = {r["path"]: r for r in records}
    assert by_path["python-alpha/alpha/core.py"]["text"] == texts["alpha_core"]
    assert by_path["python-alpha/alpha/core.py"]["source"] == "deb-src:python-alpha_1.0-1"
    assert by_path["py-beta/beta/mod.py"]["source"] == "pypi:beta==2.0"
    with gzip.open(built / "manifest.jsonl.gz", "rt") as f:
        manifest = {row["path"]: row for row in map(json.loads, f)}
    assert manifest.keys() == by_path.keys()
    for path, row in manifest.items():
        assert row["license"] == by_path[path]["license"]
        assert row["sha256"] == hashlib.sha256(by_path[path]["text"].encode()).hexdigest()
    summary = json.loads((built / "summary.json").read_text())
    assert summary["total"]["files"] == len(records)
    assert summary["shards"] == {"train-09.jsonl.xz": (built / "train-09.jsonl.xz").stat().st_size}
    assert summary["drop_reasons"]["archive:not_downloaded"] == 1


def test_a_later_shard_built_with_this_manifest_repeats_nothing(built, shard_module, tmp_path):
    """The chain train-02 -> 03 -> 04: this shard's manifest as a prior one leaves nothing new here."""
    scratch = built.parent / "scratch"
    out = tmp_path / "next"
    shard_module.main(
        [
            "build",
            "--packages",
            str(built.parent / "python_packages.txt"),
            "--scratch",
            str(scratch),
            "--out",
            str(out),
            "--shard-name",
            "train-09.jsonl.xz",
            "--humaneval",
            str(built.parent / "eval.jsonl.gz"),
            "--prior-manifest",
            str(built.parent / "manifest-prior.jsonl.gz"),
            "--prior-manifest",
            str(built / "manifest.jsonl.gz"),
            "--existing-manifest",
            str(built.parent / "manifest-multilingual.jsonl.gz"),
            "--cached-only",
        ]
    )
    assert shard_records(out) == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dedup"]["in_prior_shard"] == 4
    assert "archive:not_cached" not in summary["drop_reasons"]  # the first build cached every archive


def test_the_shard_is_filled_to_its_target_and_never_over_its_limit(shard_module, tmp_path):
    """More candidates than fit: the shard stops near --target-mib, under --max-mib, as its manifest says."""
    scratch = tmp_path / "scratch"
    (scratch / "pypi-py").mkdir(parents=True)
    lines = []
    for k in range(100):  # one small project each, so the 3% per-project cap does not bind
        name = f"pkg{k}"
        files = {
            f"{name}-1.0/PKG-INFO": pkg_info(name, "MIT"),
            f"{name}-1.0/{name}/m.py": module_code(100 + k, 60),
        }
        write_tar(scratch / "pypi-py" / f"{name}-1.0.tar.gz", files)
        lines.append(f"pypi {name} version=1.0 files={name}-1.0.tar.gz")
    packages = tmp_path / "python_packages.txt"
    packages.write_text("\n".join(lines) + "\n")
    humaneval = tmp_path / "eval.jsonl.gz"
    with gzip.open(humaneval, "wt") as f:
        f.write(
            json.dumps({"prompt": f"{EVAL_SIGNATURE}\n", "entry_point": "count_vowel_runs_between"}) + "\n"
        )
    out = tmp_path / "out"
    target_mib, max_mib = 0.012, 0.016
    shard_module.main(
        ["build", "--packages", str(packages), "--scratch", str(scratch), "--out", str(out)]
        + ["--shard-name", "train-09.jsonl.xz", "--humaneval", str(humaneval), "--workers", "1"]
        + ["--target-mib", str(target_mib), "--max-mib", str(max_mib)]
    )
    size = (out / "train-09.jsonl.xz").stat().st_size
    assert 0.7 * target_mib * 2**20 < size <= max_mib * 2**20
    records = shard_records(out)
    summary = json.loads((out / "summary.json").read_text())
    assert 0 < len(records) < 100
    assert summary["drop_reasons"]["select:over_budget"] == 100 - len(records)
    with gzip.open(out / "manifest.jsonl.gz", "rt") as f:
        assert sorted(json.loads(row)["path"] for row in f) == sorted(r["path"] for r in records)


def test_fetch_downloads_the_listed_debian_files_from_the_pool(shard_module, tmp_path):
    """A local mirror (file:// URL) in Debian's pool layout stands in for deb.debian.org."""
    pool = tmp_path / "mirror" / "pool" / "main" / "p" / "python-alpha"
    pool.mkdir(parents=True)
    (pool / "python-alpha_1.0.orig.tar.gz").write_bytes(b"upstream")
    packages = tmp_path / "python_packages.txt"
    packages.write_text(
        "deb-src python-alpha version=1.0-1 files=python-alpha_1.0.orig.tar.gz,python-alpha_1.0-1.debian.tar.xz\n"
    )
    scratch = tmp_path / "scratch"
    shard_module.main(
        ["fetch", "--packages", str(packages), "--scratch", str(scratch)]
        + ["--debian-mirror", (tmp_path / "mirror").as_uri()]
    )
    got = scratch / "src" / "py"
    assert (got / "python-alpha_1.0.orig.tar.gz").read_bytes() == b"upstream"
    assert sorted(p.name for p in got.iterdir()) == [
        "python-alpha_1.0.orig.tar.gz"
    ]  # the missing file is not faked
