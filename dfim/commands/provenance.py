"""The environment a result was made in: dfim's version and git commit, torch, the device, threads and CPU.

One record, `environment()`, written into every result file a command makes (`dfim eval`, `dfim replay`,
`dfim bench-realcode`) and printed by `dfim --version`, so a number can be traced to the code and the
machine that made it. Every field falls back to None (or "unknown") rather than fail: a wheel install has
no git checkout, a machine may have no torch, /proc/cpuinfo exists on Linux only.

The engine never imports this module (it is the command line's); it imports nothing heavier than torch,
and torch only when it is installed.
"""

from __future__ import annotations

import functools
import os
import platform
import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# The repository root when dfim runs from a checkout (an editable install): dfim/commands/ -> dfim/ -> root.
REPO_ROOT = Path(__file__).resolve().parents[2]


def package_version() -> str:
    try:
        return version("dfim")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


@functools.cache
def git_commit(root: Path = REPO_ROOT) -> tuple[str | None, bool | None]:
    """(commit, modified) of the checkout dfim runs from: the HEAD commit, read from the .git files (no
    process is started: only the eval sandbox and the benchmarks may, tests/test_security.py); `modified`
    is None (unknown without running git). (None, None) outside a checkout."""
    dot_git = root / ".git"
    try:
        if dot_git.is_file():  # a worktree: "gitdir: PATH"
            gitdir = Path(dot_git.read_text(encoding="utf-8").split("gitdir:", 1)[1].strip())
            gitdir = gitdir if gitdir.is_absolute() else (root / gitdir).resolve()
        elif dot_git.is_dir():
            gitdir = dot_git
        else:
            return None, None
        common = gitdir
        if (gitdir / "commondir").is_file():  # a worktree's refs live in the main repository's folder
            common = (gitdir / (gitdir / "commondir").read_text(encoding="utf-8").strip()).resolve()
        head = (gitdir / "HEAD").read_text(encoding="utf-8").strip()
        if not head.startswith("ref:"):
            return (head if re.fullmatch(r"[0-9a-f]{40,64}", head) else None), None  # a detached HEAD
        ref = head[4:].strip()
        for folder in (gitdir, common):
            if (folder / ref).is_file():
                return (folder / ref).read_text(encoding="utf-8").strip() or None, None
        packed = common / "packed-refs"
        if packed.is_file():
            for line in packed.read_text(encoding="utf-8").splitlines():
                sha, _, name = line.partition(" ")
                if name.strip() == ref:
                    return sha, None
    except (OSError, IndexError, UnicodeDecodeError):
        pass
    return None, None


@functools.cache
def cpu_model() -> str:
    """The CPU's marketing name (Linux: /proc/cpuinfo; elsewhere what `platform` knows), or "unknown"."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def _torch_info(device: str | None) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"torch": None, "threads": None, "cuda_available": False, "gpu": None}
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),  # the intra-op threads CPU fills use (the engine sets them)
        "cuda_available": bool(torch.cuda.is_available()),
        "gpu": None,
    }
    if info["cuda_available"] and (device or "").startswith("cuda"):
        try:
            info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        except (RuntimeError, AssertionError, ValueError):
            pass
    return info


def environment(device: str | None = None) -> dict[str, Any]:
    """The record written into result files under "environment". `device`: the one the command ran on
    (None: the default a command would pick, cuda when available)."""
    commit, modified = git_commit()
    torch_info = _torch_info(device)
    if device is None:
        device = "cuda" if torch_info["cuda_available"] else "cpu"
    return {
        "dfim": package_version(),
        "commit": commit,
        "modified": modified,
        "torch": torch_info["torch"],
        "device": device,
        "gpu": torch_info["gpu"],
        "threads": torch_info["threads"],
        "usable_cores": usable_cores(),
        "cpu_count": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def version_text(env: dict[str, Any] | None = None) -> str:
    """What `dfim --version` prints: the same record as the result files, three lines."""
    env = env or environment()
    if env["commit"]:
        commit = f" (commit {env['commit'][:12]}{', modified' if env['modified'] else ''})"
    else:
        commit = " (no git checkout)"
    device = env["device"] + (f" ({env['gpu']})" if env["gpu"] else "")
    threads = "?" if env["threads"] is None else env["threads"]
    return (
        f"dfim {env['dfim']}{commit}\n"
        f"torch {env['torch'] or 'not installed'}, python {env['python']}, {env['platform']}\n"
        f"device {device}, {threads} threads of {env['usable_cores']} usable cores, CPU: {env['cpu']}"
    )
