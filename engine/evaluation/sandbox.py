"""Run untrusted Python (model completions plus a test) in a contained subprocess.

What one run gets:
- a fresh temporary directory as its working directory, deleted afterwards;
- an isolated interpreter (`python -I -S`: no PYTHON* variables, no user or site packages, script
  directory not on sys.path). The standard library works; third-party packages do not;
- resource limits: CPU seconds, address space, file size, no core files, number of processes, open files;
- a wall-clock timeout; the child leads its own session, so the whole process group is killed;
- an environment of PATH and LANG only (no inherited secrets), stdin from /dev/null, stdout and stderr
  written to files in the temporary directory (capped by the file-size limit) of which only the tail is kept.

The limits are set by a tiny launcher that runs first in the child and then `exec`s the program, rather
than in `preexec_fn`: the evaluating process holds torch's thread pool and a pool of worker threads, and
Python documents `preexec_fn` as unsafe in a process with threads (it can deadlock in the forked child).

This contains accidents of generated code (infinite loops, memory bombs, crashes, stray files). It is not a
security boundary: there is no network or filesystem namespace, and RLIMIT_NPROC does not bind root. Run
evaluations of untrusted models as an unprivileged user or in a container.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Runs inside the child before the program: apply limits (soft = hard, so the program cannot raise them
# again unless it is root), then replace itself with a clean interpreter running the program.
_LAUNCHER = """
import os, resource, sys
cpu, mem, fsize, nproc, nofile = (int(x) for x in sys.argv[1:6])
def limit(kind, value):
    try:
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError, OverflowError):
        pass  # a limit the platform does not support or cannot hold, or one above the inherited hard limit
limit(resource.RLIMIT_CORE, 0)
if cpu > 0:
    limit(resource.RLIMIT_CPU, cpu)
if mem > 0:
    limit(resource.RLIMIT_AS, mem)
limit(resource.RLIMIT_FSIZE, fsize)
limit(resource.RLIMIT_NPROC, nproc)
limit(resource.RLIMIT_NOFILE, nofile)
os.execv(sys.executable, [sys.executable, "-I", "-S", sys.argv[6]])
"""


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


@dataclass
class SandboxResult:
    passed: bool  # exited with status 0 within the limits
    timed_out: bool  # wall-clock timeout or CPU limit (SIGXCPU)
    returncode: int | None  # negative: killed by that signal; None if it never started
    stderr: str  # tail
    stdout: str  # tail
    duration_ms: float


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


def run_program(source: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Write `source` to a fresh directory and run it under the limits. Never raises for the program's sake."""
    limits = limits or SandboxLimits()
    finite = math.isfinite(limits.timeout_s)
    cpu_s = limits.cpu_s or (int(limits.timeout_s) + 1 if finite and limits.timeout_s < MAX_CPU_S else 0)
    cpu_s = cpu_s if cpu_s < MAX_CPU_S else 0  # 0: no CPU limit
    memory = limits.memory_bytes if limits.memory_bytes < MAX_BYTES else 0  # 0: no address-space limit
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dfim-sandbox-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        program = work / "main.py"
        program.write_text(source, encoding="utf-8")
        out_path, err_path = work / ".stdout", work / ".stderr"
        args = [
            sys.executable,
            "-I",
            "-S",
            "-c",
            _LAUNCHER,
            str(cpu_s),
            str(memory),
            str(limits.file_bytes),
            str(limits.processes),
            str(limits.open_files),
            str(program),
        ]
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(
                    args,
                    cwd=work,
                    env=minimal_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,  # own process group: one killpg reaches its children too
                    close_fds=True,
                )
            except OSError as e:
                return SandboxResult(False, False, None, f"could not start: {e}", "", 0.0)
            try:
                returncode = proc.wait(timeout=limits.timeout_s if finite else None)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc.pid)
                returncode = proc.wait()
            # Children the program left behind (background processes) die with the group.
            _kill_group(proc.pid)
        if returncode == -signal.SIGXCPU:
            timed_out = True
        duration_ms = (time.perf_counter() - start) * 1000.0
        return SandboxResult(
            passed=returncode == 0 and not timed_out,
            timed_out=timed_out,
            returncode=returncode,
            stderr=_tail(err_path, limits.output_chars),
            stdout=_tail(out_path, limits.output_chars),
            duration_ms=duration_ms,
        )


def humaneval_program(prompt: str, completion: str, suffix: str, test: str, entry_point: str) -> str:
    """The program whose exit status decides pass@1 for one HumanEval-infilling problem."""
    return prompt + completion + suffix + "\n" + test + f"\ncheck({entry_point})\n"
