"""Escapes from the eval sandbox (issue 34): each is tried under every isolation layer the machine has.

Each test also runs its escape with the layer that should stop it turned off where that layer is the only
one (`SandboxLimits(namespaces=False, ...)`), and asserts the escape then works: the check can fail.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest

from dfim.engine.evaluation import sandbox
from dfim.engine.evaluation.sandbox import SandboxLimits, run_program

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the isolation layers are Linux's")

FULL = SandboxLimits(timeout_s=10.0)
NO_LAYERS = SandboxLimits(timeout_s=10.0, namespaces=False, landlock=False, seccomp=False)
REPORT = sandbox.probe(FULL)


def needs(*fields: str):
    have = all(REPORT.get(f) for f in fields)
    return pytest.mark.skipif(
        not have, reason=f"this kernel lacks {', '.join(fields)}: {REPORT.get('errors')}"
    )


def processes_with(token: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line holds `token`, seen from outside any namespace."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token.encode() in cmdline and state != "Z":
            found.append(int(name))
    return found


def daemon_program(token: str, marker: Path) -> str:
    """Forks a child that leaves the session (setsid), outlives the program and then writes `marker`."""
    child = f"import time; time.sleep(3); open({str(marker)!r}, 'w').write('escaped')  # {token}"
    return (
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', {child!r}, {token!r}])\n"
        "    os._exit(0)\n"
        "import time; time.sleep(0.5)\n"
        "print('parent done')\n"
    )


def run_daemon(limits: SandboxLimits, tmp_path: Path) -> tuple[sandbox.SandboxResult, list[int], bool]:
    token = f"dfim-escape-{uuid.uuid4().hex}"
    marker = tmp_path / "escaped.txt"
    result = run_program(daemon_program(token, marker), limits, writable=[tmp_path])
    survivors = processes_with(token)
    time.sleep(4.0)  # past the daemon's sleep: had it lived, the marker would be there
    return result, survivors, marker.exists()


@pytest.mark.parametrize(
    "limits",
    [FULL, SandboxLimits(timeout_s=10.0, namespaces=False)],
    ids=["pid-namespace", "subreaper"],
)
def test_a_setsid_daemon_is_dead_after_the_run(limits, tmp_path):
    result, survivors, escaped = run_daemon(limits, tmp_path)
    assert result.passed, result.stderr
    assert "parent done" in result.stdout
    assert survivors == [] and not escaped
    for pid in survivors:  # (never reached while the test passes) no stray process left by a failing run
        os.kill(pid, 9)


def test_a_setsid_daemon_outlives_a_plain_process_group_kill(tmp_path):
    """The check above can fail: the old sandbox (a process-group kill only) let the daemon escape."""
    token = f"dfim-escape-{uuid.uuid4().hex}"
    marker = tmp_path / "escaped.txt"
    import subprocess

    program = tmp_path / "daemon.py"
    program.write_text(daemon_program(token, marker), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-I", "-S", str(program)], start_new_session=True)
    proc.wait(timeout=10)
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    try:
        assert processes_with(token)
    finally:
        for pid in processes_with(token):
            os.kill(pid, 9)


WRITE_OUTSIDE = (
    "import sys\n"
    "try:\n"
    "    open({path!r}, 'w').write('x')\n"
    "except OSError as e:\n"
    "    print('refused', e.errno)\n"
    "    sys.exit(3)\n"
)


@pytest.mark.parametrize(
    "limits",
    [
        FULL,
        pytest.param(
            SandboxLimits(timeout_s=10.0, namespaces=False), marks=needs("landlock_fs"), id="landlock"
        ),
        pytest.param(SandboxLimits(timeout_s=10.0, landlock=False), marks=needs("readonly_root"), id="mount"),
    ],
    ids=lambda v: "all" if v is FULL else None,
)
def test_writing_outside_the_temporary_directory_fails(limits, tmp_path):
    target = tmp_path / "outside.txt"
    result = run_program(WRITE_OUTSIDE.format(path=str(target)), limits)
    assert result.returncode == 3, result.stdout + result.stderr
    assert not target.exists()
    inside = run_program("open('scratch', 'w').write('x')\nimport tempfile\ntempfile.mkstemp()\n", limits)
    assert inside.passed, inside.stderr  # its own directory (and TMPDIR) stays writable


def test_without_layers_writing_outside_works(tmp_path):
    target = tmp_path / "outside.txt"
    result = run_program(WRITE_OUTSIDE.format(path=str(target)), NO_LAYERS)
    assert result.passed and target.read_text() == "x"


CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection(('127.0.0.1', {port}), timeout=3).sendall(b'escaped')\n"
    "except OSError as e:\n"
    "    print('refused', e)\n"
    "    sys.exit(3)\n"
)


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.5)
    yield server
    server.close()


def accepted(server: socket.socket) -> bool:
    try:
        conn, _ = server.accept()
    except TimeoutError:
        return False
    conn.close()
    return True


@pytest.mark.parametrize(
    "limits",
    [
        FULL,
        pytest.param(
            SandboxLimits(timeout_s=10.0, landlock=False, seccomp=False),
            marks=needs("net_namespace"),
            id="netns",
        ),
        pytest.param(
            SandboxLimits(timeout_s=10.0, namespaces=False, landlock=False),
            marks=needs("seccomp_no_sockets"),
            id="seccomp",
        ),
        pytest.param(
            SandboxLimits(timeout_s=10.0, namespaces=False, seccomp=False),
            marks=needs("landlock_tcp"),
            id="landlock",
        ),
    ],
    ids=lambda v: "all" if v is FULL else None,
)
def test_a_connection_to_localhost_fails(limits, listener):
    port = listener.getsockname()[1]
    result = run_program(CONNECT.format(port=port), limits)
    assert result.returncode == 3, result.stdout + result.stderr
    assert not accepted(listener)


def test_without_layers_a_connection_to_localhost_works(listener):
    port = listener.getsockname()[1]
    result = run_program(CONNECT.format(port=port), NO_LAYERS)
    assert result.passed, result.stderr
    assert accepted(listener)


def test_results_record_the_isolation_in_force():
    full = run_program("pass\n", FULL)
    assert full.isolation is not None
    assert {k: v for k, v in REPORT.items() if k != "missing"} == full.isolation
    assert set(sandbox.missing_layers(full.isolation)) == set(REPORT["missing"])
    bare = run_program("pass\n", NO_LAYERS)
    assert bare.passed
    assert bare.isolation["kill"] == "subreaper"
    assert not any(
        bare.isolation[k] for k in ("pid_namespace", "net_namespace", "landlock_fs", "seccomp_no_sockets")
    )
    assert sandbox.missing_layers(bare.isolation) == ["kill", "filesystem", "network"]
    subreaper = run_program("pass\n", SandboxLimits(timeout_s=10.0, namespaces=False))
    assert ("kill" in sandbox.missing_layers(subreaper.isolation)) == (not REPORT["landlock_scoped"])
    assert "not a full boundary" in sandbox.warning({"missing": sandbox.missing_layers(bare.isolation)})


def test_cpu_time_is_measured_and_the_cpu_limit_recorded():
    result = run_program("x = 0\nfor i in range(3_000_000):\n    x += i\n", FULL)
    assert result.passed and result.cpu_s is not None and result.cpu_s > 0.05
    assert SandboxLimits(timeout_s=10.0).record()["cpu_s"] == 11  # the limit in force, not 0
    assert SandboxLimits(timeout_s=10.0, cpu_s=3).record()["cpu_s"] == 3


@needs("pid_namespace")
def test_the_supervisor_cannot_be_killed_by_the_program():
    """The program SIGKILLs its parent, the supervisor (PID 1 of its namespace); the run still reports."""
    program = (
        "import os, signal\n"
        "try:\n"
        "    os.kill(os.getppid(), signal.SIGKILL)  # ignored by a PID 1, or refused by Landlock's scope\n"
        "except PermissionError:\n"
        "    pass\n"
        "print(os.getppid())\n"
    )
    result = run_program(program, FULL)
    assert result.isolation is not None  # the supervisor lived to report
    assert result.passed and result.stdout.strip() == "1", result.stderr
