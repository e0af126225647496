"""Run untrusted Python (model completions plus a test) in a contained subprocess.

What one run gets:
- a fresh temporary directory as its working directory (and TMPDIR), deleted afterwards;
- an isolated interpreter (`python -I -S`: no PYTHON* variables, no user or site packages, script
  directory not on sys.path). The standard library works; third-party packages do not;
- isolation where the kernel allows it without root (engine/evaluation/sandbox_child.py does it): PID,
  network and mount namespaces (every descendant dies with the run, `setsid()` ones too; no network, 127.0.0.1
  included; a read-only root), Landlock (no writes outside the temporary directory), a seccomp filter (no
  socket can be made). What was in force is in each result (`SandboxResult.isolation`), and `probe()` says it
  for a machine; where a layer is missing the run goes on with the others, and `missing_layers` names it;
- resource limits: CPU seconds, address space, file size, no core files, number of processes, open files;
- a wall-clock timeout, enforced by the supervisor in the child, with the process group killed as a backstop;
- an environment of PATH, LANG and TMPDIR only (no inherited secrets), stdin from /dev/null, stdout and stderr
  written to files in the temporary directory (capped by the file-size limit) of which only the tail is kept.

The isolation is set up by a launcher that runs first in the child and then `exec`s the program, rather
than in `preexec_fn`: the evaluating process holds torch's thread pool and a pool of worker threads, and
Python documents `preexec_fn` as unsafe in a process with threads (it can deadlock in the forked child); a
process with threads cannot enter a user namespace either. docs/security.md says what this is and is not.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Past these a limit is no limit, and is not set: `setrlimit` overflows its C long, and Linux mishandles some
# huge CPU limits (RLIMIT_CPU of 2**62 s killed the child at once).
MAX_CPU_S = 2**31
MAX_BYTES = 2**62


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock; HumanEval tests take well under a second
    cpu_s: int = 0  # 0 = ceil(timeout_s) + 1; CPU time can only be <= wall time for one thread
    memory_bytes: int = 1 << 30  # address space; 1 GiB is plenty for the tests, contains memory bombs
    file_bytes: int = 16 << 20  # largest file the program may write (also caps captured output)
    processes: int = 64  # RLIMIT_NPROC counts all processes of the user, so not 1; ignored for root
    open_files: int = 64
    output_chars: int = 2000  # tail of stdout/stderr kept in the result
    # Isolation layers to try (each is used only where the kernel allows it); off only to test the others.
    namespaces: bool = True
    landlock: bool = True
    seccomp: bool = True

    def effective_cpu_s(self) -> int:
        """The CPU-seconds limit in force (0: none): `cpu_s`, or ceil(timeout_s) + 1 when it is 0."""
        finite = math.isfinite(self.timeout_s)
        cpu_s = self.cpu_s or (int(self.timeout_s) + 1 if finite and self.timeout_s < MAX_CPU_S else 0)
        return cpu_s if cpu_s < MAX_CPU_S else 0

    def record(self) -> dict[str, Any]:
        """The limits as a result file records them: the CPU limit in force, not the 0 that means "derive"."""
        fields = dataclasses.asdict(self)
        fields["cpu_s"] = self.effective_cpu_s()
        return fields


@dataclass
class SandboxResult:
    passed: bool  # exited with status 0 within the limits
    timed_out: bool  # wall-clock timeout or CPU limit (SIGXCPU)
    returncode: int | None  # negative: killed by that signal; None if it never started
    stderr: str  # tail
    stdout: str  # tail
    duration_ms: float
    cpu_s: float | None = None  # CPU seconds the program used (its own and its waited-for children's)
    isolation: dict[str, Any] | None = None  # what was in force (sandbox_child.py's report); None: unknown


CHILD = Path(__file__).with_name("sandbox_child.py")
GRACE_S = 5.0  # past the timeout, the supervisor in the child had its chance: kill its process group


def minimal_env() -> dict[str, str]:
    """PATH and LANG only: nothing the evaluating shell knows (tokens, keys, proxies) reaches the program."""
    return {"PATH": os.defpath, "LANG": "C.UTF-8"}


def _tail(path: Path, chars: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4 * chars))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text[-chars:]


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_program(
    source: str, limits: SandboxLimits | None = None, writable: Sequence[str | os.PathLike] = ()
) -> SandboxResult:
    """Write `source` to a fresh directory and run it under the limits. Never raises for the program's sake.

    `writable`: directories the program may write besides its own (a benchmark's copy of a project)."""
    limits = limits or SandboxLimits()
    # None: no wall-clock limit (an infinite or absurd timeout; `select` and time_t overflow past MAX_CPU_S)
    wall_s = limits.timeout_s if math.isfinite(limits.timeout_s) and limits.timeout_s < MAX_CPU_S else None
    memory = limits.memory_bytes if limits.memory_bytes < MAX_BYTES else 0  # 0: no address-space limit
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dfim-sandbox-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp).resolve()
        program = work / "main.py"
        program.write_text(source, encoding="utf-8")
        out_path, err_path = work / ".stdout", work / ".stderr"
        config = {
            "workdir": str(work),
            "writable": [str(Path(p).resolve()) for p in writable],
            "program": str(program),
            "timeout_s": wall_s or 0,
            "cpu_s": limits.effective_cpu_s(),
            "memory_bytes": memory,
            "file_bytes": limits.file_bytes,
            "processes": limits.processes,
            "open_files": limits.open_files,
            "namespaces": limits.namespaces,
            "landlock": limits.landlock,
            "seccomp": limits.seccomp,
        }
        status_read, status_write = os.pipe()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(CHILD), json.dumps(config), str(status_write)],
                    cwd=work,
                    env={**minimal_env(), "TMPDIR": str(work)},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,  # own process group: the backstop killpg reaches the supervisor
                    close_fds=True,
                    pass_fds=(status_write,),
                )
            except OSError as e:
                os.close(status_read)
                return SandboxResult(False, False, None, f"could not start: {e}", "", 0.0)
            finally:
                os.close(status_write)  # the child has its own copy: EOF once the supervisor is done
            status, hung = _read_status(status_read, wall_s + GRACE_S if wall_s is not None else None)
            if status is None:  # the supervisor hung or died: kill what is left of its group
                _kill_group(proc.pid)
            returncode = proc.wait()
            _kill_group(proc.pid)
        duration_ms = (time.perf_counter() - start) * 1000.0
        stderr = _tail(err_path, limits.output_chars)
        if status is None:
            final: dict[str, Any] = {"returncode": returncode, "timed_out": hung, "cpu_s": None}
            isolation = None
            stderr = (stderr + "\nsandbox: the supervisor did not report").strip()
        else:
            final, isolation = status["final"], status["isolation"]
        code = final["returncode"]
        timed_out = bool(final["timed_out"]) or code == -signal.SIGXCPU
        return SandboxResult(
            passed=code == 0 and not timed_out,
            timed_out=timed_out,
            returncode=code,
            stderr=stderr,
            stdout=_tail(out_path, limits.output_chars),
            duration_ms=duration_ms,
            cpu_s=final.get("cpu_s"),
            isolation=isolation,
        )


def _read_status(fd: int, timeout_s: float | None) -> tuple[dict[str, Any] | None, bool]:
    """The supervisor's last JSON line from the status pipe (None if none came before EOF or the timeout),
    and whether the timeout ended the wait."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    data = b""
    hung = False
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            ready = remaining is None or remaining > 0
            if ready:
                ready = bool(select.select([pipe], [], [], remaining)[0])
            if not ready:
                hung = True
                break
            chunk = pipe.read(65536)
            if not chunk:
                break
            data += chunk
    for line in reversed(data.splitlines()):
        try:
            status = json.loads(line)
        except ValueError:
            continue
        if isinstance(status, dict) and "final" in status:
            return status, hung
    return None, hung


# Layers whose absence makes the sandbox something less than a boundary, with what is lost without each.
LAYERS = {
    "kill": "every descendant dies with the run (PID namespace, or a subreaper the program cannot signal)",
    "filesystem": "writes outside the temporary directory are refused (Landlock or a read-only mount)",
    "network": "no socket can be opened (network namespace or seccomp)",
}


def missing_layers(isolation: dict[str, Any] | None) -> list[str]:
    """Which of LAYERS a run's isolation report lacks; all of them when there is no report."""
    if not isolation:
        return list(LAYERS)
    have = {
        # a subreaper reaches every descendant unless the program kills it first, which Landlock's signal
        # scope (ABI 6) forbids
        "kill": isolation.get("pid_namespace", False) or isolation.get("landlock_scoped", False),
        "filesystem": isolation.get("landlock_fs", False) or isolation.get("readonly_root", False),
        "network": isolation.get("net_namespace", False) or isolation.get("seccomp_no_sockets", False),
    }
    return [name for name, ok in have.items() if not ok]


@functools.lru_cache(maxsize=8)
def probe(limits: SandboxLimits | None = None) -> dict[str, Any]:
    """What isolation this machine gives a run: an empty program's report, plus `missing` (see LAYERS)."""
    result = run_program("pass\n", limits or SandboxLimits(timeout_s=10.0))
    report = dict(result.isolation or {})
    report["missing"] = missing_layers(result.isolation)
    return report


def warning(report: dict[str, Any]) -> str | None:
    """One line for the user when the sandbox is not a full boundary here, else None."""
    missing = report.get("missing") or []
    if not missing:
        return None
    lost = "; ".join(f"{name}: {LAYERS[name]}" for name in missing)
    reasons = "; ".join(f"{k}: {v}" for k, v in (report.get("errors") or {}).items())
    return (
        f"the test sandbox is not a full boundary on this machine (missing {lost})"
        f"{' [' + reasons + ']' if reasons else ''}. Run evaluations of untrusted models in a container or VM."
    )


def humaneval_program(prompt: str, completion: str, suffix: str, test: str, entry_point: str) -> str:
    """The program whose exit status decides pass@1 for one HumanEval-infilling problem."""
    return prompt + completion + suffix + "\n" + test + f"\ncheck({entry_point})\n"
