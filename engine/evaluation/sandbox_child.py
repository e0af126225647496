"""The sandbox's launcher: runs first in the child process, isolates it, then runs the untrusted program.

Run as a script (`python -I -S sandbox_child.py CONFIG_JSON STATUS_FD`) by `dfim.engine.evaluation.sandbox`;
standard library only, because `-I -S` hides site-packages. Every layer is tried and used when the kernel
allows it without root, and what was in force is reported, so a result file can say what it ran under:

1. namespaces (`unshare(2)` of a user, PID, network, mount and IPC namespace; unprivileged where the kernel
   and its security modules allow user namespaces): the program runs under a PID 1 of its own, and when that
   init exits the kernel kills every process left in the namespace, `setsid()` daemons included; the network
   namespace has only a loopback device that is down, so nothing connects anywhere, 127.0.0.1 included; the
   mount namespace gets a fresh /proc (outside processes are invisible) and a read-only root with the
   program's directories bound writable;
2. Landlock (Linux 5.13+, unprivileged): no file or directory can be created, written, renamed or removed
   outside the writable directories; on ABI 4+ no TCP connect or bind; on ABI 6+ no signal to a process
   outside the sandbox and no abstract unix socket outside it;
3. seccomp (x86-64 and arm64): `socket(2)` and `io_uring_setup(2)` fail with EACCES, so no socket of any
   family can be made (`socketpair(2)` still works: it reaches nothing outside);
4. rlimits: CPU seconds, address space, file size, processes, open files, no core files;
5. without a PID namespace: the supervisor is a child subreaper (PR_SET_CHILD_SUBREAPER), so orphans,
   `setsid()` ones included, are re-parented to it, and it kills them all before it reports.

Process tree: launcher -> (namespaces: fork) supervisor, PID 1 in the namespace -> fork -> program, which
applies Landlock, seccomp and the rlimits to itself and `exec`s `python -I -S main.py`. The supervisor
enforces the wall-clock timeout, kills every descendant, and writes one JSON line to STATUS_FD (a pipe that
the evaluating process reads). The program cannot write to that pipe: the supervisor is not dumpable and the
program's copy is closed before `exec`.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import select
import signal
import struct
import sys
import time

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x00020000,
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER, PR_SET_SECCOMP = (
    1,
    4,
    38,
    36,
    22,
)
# Syscall numbers shared by every architecture (the unified table since Linux 5.x).
SYS_MOUNT_SETATTR, SYS_LANDLOCK_CREATE, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT = 442, 444, 445, 446
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1

LINUX = sys.platform.startswith("linux")  # elsewhere: rlimits, the timeout and a process-group kill only
LIBC = ctypes.CDLL(None, use_errno=True)
if LINUX:
    LIBC.syscall.restype = ctypes.c_long
    LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]


def _check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def _prctl(option: int, arg: int = 0) -> None:
    _check(LIBC.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


# ---- namespaces -------------------------------------------------------------------------------------------


def enter_namespaces() -> None:
    """New user, PID, network, mount and IPC namespaces, with this user mapped to itself (no new identity).

    Raises OSError where the kernel refuses (user namespaces off, or restricted by AppArmor or SELinux)."""
    uid, gid = os.getuid(), os.getgid()
    _check(LIBC.unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC), "unshare")
    # Without these maps the program would see itself as "nobody"; writes keep the real uid either way.
    for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                       ("/proc/self/gid_map", f"{gid} {gid} 1")):  # fmt: skip
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError:
            pass


def _mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    def enc(text: str | None) -> bytes | None:
        return text.encode() if text is not None else None

    _check(LIBC.mount(enc(source), enc(target), enc(fstype), flags, None), f"mount {target}")


def _mount_setattr(path: str, attr_set: int, attr_clr: int) -> None:
    attr = struct.pack("QQQQ", attr_set, attr_clr, 0, 0)  # struct mount_attr
    buf = ctypes.create_string_buffer(attr)
    _check(
        LIBC.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), AT_RECURSIVE, buf, len(attr)),
        f"mount_setattr {path}",
    )


def private_mounts(writable: list[str], report: dict) -> None:
    """In the new mount namespace: a /proc of the new PID namespace, and a read-only root but `writable`."""
    try:
        _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here propagates back to the host
    except OSError as e:
        report["errors"]["mounts"] = str(e)
        return
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        report["private_proc"] = True
    except OSError as e:
        report["errors"]["proc"] = str(e)
    try:
        for path in writable:  # bound onto themselves first, so they are mounts of their own to make writable
            _mount(path, path, None, MS_BIND | MS_REC)
        _mount_setattr("/", MOUNT_ATTR_RDONLY, 0)
        for path in writable:
            _mount_setattr(path, 0, MOUNT_ATTR_RDONLY)
        report["readonly_root"] = True
    except OSError as e:
        report["errors"]["readonly_root"] = str(e)


# ---- Landlock ---------------------------------------------------------------------------------------------

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_WRITE_TREE = sum(1 << b for b in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
FS_REFER, FS_TRUNCATE = 1 << 13, 1 << 14
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none (old kernel, or the LSM not enabled)."""
    result = LIBC.syscall(SYS_LANDLOCK_CREATE, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    return max(0, int(result))


def landlock(writable: list[str], report: dict) -> None:
    """Restrict this process and its descendants: writes only under `writable`, and what the ABI offers."""
    abi = landlock_abi()
    report["landlock_abi"] = abi
    if abi < 1:
        report["errors"]["landlock"] = "not available in this kernel"
        return
    fs = FS_WRITE_FILE | FS_WRITE_TREE | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    attr = struct.pack("QQQ", fs, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = _check(
        LIBC.syscall(SYS_LANDLOCK_CREATE, ctypes.create_string_buffer(attr), len(attr), 0), "landlock"
    )
    try:
        rules = [(path, fs) for path in writable]
        rules.append(("/dev/null", FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0)))  # a file: file rights
        for path, allowed in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = ctypes.create_string_buffer(
                    struct.pack("=Qi", allowed, fd)
                )  # path_beneath_attr, packed
                _check(LIBC.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, 1, rule, 0), f"landlock rule {path}")
            finally:
                os.close(fd)
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        _check(LIBC.syscall(SYS_LANDLOCK_RESTRICT, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    report.update(landlock_fs=True, landlock_tcp=bool(net), landlock_scoped=bool(scoped))


# ---- seccomp ----------------------------------------------------------------------------------------------

# (audit arch, socket, io_uring_setup) per machine; other syscalls keep their numbers unchecked.
SECCOMP_ARCHES = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, EACCES = 0x7FFF0000, 0x00050000, 13
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06


def seccomp_no_sockets(report: dict) -> None:
    """A seccomp filter: socket() and io_uring_setup() fail with EACCES, and so does any syscall made
    through another ABI (x32, or 32-bit calls on a 64-bit kernel), whose numbers this filter does not know."""
    arch = SECCOMP_ARCHES.get(platform.machine())
    if arch is None:
        report["errors"]["seccomp"] = f"no filter for {platform.machine()}"
        return
    audit_arch, nr_socket, nr_io_uring = arch
    deny = SECCOMP_RET_ERRNO | EACCES
    program = [  # (code, jump if true, jump if false, k): classic BPF over struct seccomp_data
        (BPF_LD_W_ABS, 0, 0, 4),  # arch
        (BPF_JEQ_K, 1, 0, audit_arch),
        (BPF_RET_K, 0, 0, deny),
        (BPF_LD_W_ABS, 0, 0, 0),  # syscall number
        (BPF_JGE_K, 3, 0, 0x40000000),  # x32 on x86-64
        (BPF_JEQ_K, 2, 0, nr_socket),
        (BPF_JEQ_K, 1, 0, nr_io_uring),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        (BPF_RET_K, 0, 0, deny),
    ]
    code = b"".join(struct.pack("=HBBI", *insn) for insn in program)
    filters = ctypes.create_string_buffer(code)
    fprog = struct.pack("@HP", len(program), ctypes.addressof(filters))  # struct sock_fprog
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    fprog_buf = ctypes.create_string_buffer(fprog)
    _check(LIBC.prctl(PR_SET_SECCOMP, 2, fprog_buf, 0, 0), "seccomp")  # SECCOMP_MODE_FILTER
    report["seccomp_no_sockets"] = True


# ---- the program process ----------------------------------------------------------------------------------


def set_limits(cfg: dict) -> None:
    def limit(kind: int, value: int) -> None:
        try:
            resource.setrlimit(kind, (value, value))  # soft = hard: the program cannot raise it again
        except (ValueError, OSError, OverflowError):
            pass  # a limit the platform does not support, or one above the inherited hard limit

    limit(resource.RLIMIT_CORE, 0)
    if cfg["cpu_s"] > 0:
        limit(resource.RLIMIT_CPU, cfg["cpu_s"])
    if cfg["memory_bytes"] > 0:
        limit(resource.RLIMIT_AS, cfg["memory_bytes"])
    limit(resource.RLIMIT_FSIZE, cfg["file_bytes"])
    limit(resource.RLIMIT_NPROC, cfg["processes"])
    limit(resource.RLIMIT_NOFILE, cfg["open_files"])


def become_program(cfg: dict, report_fd: int) -> None:
    """In the forked program process: confine itself, report what held, and exec the interpreter."""
    report: dict = {"errors": {}}
    writable = [cfg["workdir"], *cfg["writable"]]
    if not LINUX:
        os.setpgid(0, 0)  # a group of its own, which the supervisor kills at the end
    if cfg["landlock"] and LINUX:
        try:
            landlock(writable, report)
        except OSError as e:
            report["errors"]["landlock"] = str(e)
    if cfg["seccomp"] and LINUX:
        try:
            seccomp_no_sockets(report)
        except OSError as e:
            report["errors"]["seccomp"] = str(e)
    set_limits(cfg)
    os.write(report_fd, json.dumps(report).encode())
    os.close(report_fd)
    os.chdir(cfg["workdir"])
    os.execv(sys.executable, [sys.executable, "-I", "-S", cfg["program"]])


# ---- the supervisor ---------------------------------------------------------------------------------------


def _children_of(pid: int) -> list[int]:
    """Live children of `pid` (from /proc: its `children` file where the kernel has one, else every stat)."""
    try:
        found: list[int] = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(x) for x in f.read().split()]
        return found
    except OSError:
        pass
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(name))
    return found


def kill_descendants(in_pid_namespace: bool) -> int:
    """Kill every descendant and reap them all; returns how many were killed after the program ended.

    As PID 1 of a namespace, kill(-1) reaches every other process in it. As a subreaper, orphans of killed
    children are re-parented here, so killing children until none is left reaches every descendant."""
    killed = 0
    while True:
        if in_pid_namespace:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            for pid in _children_of(os.getpid()):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            os.waitpid(-1, 0)
            killed += 1
        except ChildProcessError:
            return killed


def wait_program(pid: int, timeout_s: float) -> tuple[int | None, float, bool]:
    """Wait for the program until the deadline: (wait status or None, CPU seconds it used, timed out)."""
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        return _wait(pid, pidfd, deadline)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _wait(pid: int, pidfd: int | None, deadline: float | None) -> tuple[int | None, float, bool]:
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage.ru_utime + usage.ru_stime, False
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            return status, usage.ru_utime + usage.ru_stime, True
        # Orphans re-parented here meanwhile stay zombies until the end: reaping them with waitpid(-1) could
        # take the program's own status.
        if pidfd is not None:
            select.select([pidfd], [], [], remaining)
        else:
            time.sleep(min(0.01, remaining) if remaining is not None else 0.01)


def supervise(cfg: dict, status_fd: int, report: dict, in_pid_namespace: bool) -> None:
    """Start the program, wait for it under the timeout, kill what it left, and report on `status_fd`."""
    if LINUX:
        _prctl(PR_SET_DUMPABLE, 0)  # the program cannot open this process's fds through /proc
        if not in_pid_namespace:
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
    report["kill"] = "pid-namespace" if in_pid_namespace else "subreaper" if LINUX else "process-group"
    read_end, write_end = os.pipe()  # the program's own report; closed by its exec (O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.close(status_fd)
        try:
            become_program(cfg, write_end)
        except BaseException as e:  # noqa: BLE001 - the program could not start: say why on its stderr
            os.write(2, f"sandbox: cannot start the program: {e!r}\n".encode())
        os._exit(127)
    os.close(write_end)
    status, cpu_s, timed_out = wait_program(pid, cfg["timeout_s"])
    if not LINUX:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    leftovers = kill_descendants(in_pid_namespace) if LINUX else 0
    with os.fdopen(read_end, "rb") as f:
        try:
            program_report = json.loads(f.read() or b"{}")
        except ValueError:
            program_report = {}
    report["errors"].update(program_report.pop("errors", {}))
    report.update(program_report)
    if status is None:
        code = None
    elif os.WIFSIGNALED(status):
        code = -os.WTERMSIG(status)
    else:
        code = os.WEXITSTATUS(status)
    final = {"returncode": code, "timed_out": timed_out, "cpu_s": round(cpu_s, 3), "killed_after": leftovers}
    os.write(status_fd, (json.dumps({"final": final, "isolation": report}) + "\n").encode())
    os.close(status_fd)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    status_fd = int(sys.argv[2])
    report: dict = {
        "pid_namespace": False,
        "net_namespace": False,
        "mount_namespace": False,
        "private_proc": False,
        "readonly_root": False,
        "landlock_abi": 0,
        "landlock_fs": False,
        "landlock_tcp": False,
        "landlock_scoped": False,
        "seccomp_no_sockets": False,
        "errors": {},
    }
    in_namespace = False
    if cfg["namespaces"] and LINUX:
        try:
            enter_namespaces()
            in_namespace = True
        except OSError as e:
            report["errors"]["namespaces"] = str(e)
    if not in_namespace:
        supervise(cfg, status_fd, report, in_pid_namespace=False)
        return
    report.update(pid_namespace=True, net_namespace=True, mount_namespace=True)
    _prctl(PR_SET_DUMPABLE, 0)
    pid = os.fork()  # the first child in the new PID namespace is its PID 1
    if pid == 0:
        try:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the launcher killed from outside: the namespace dies
            private_mounts([cfg["workdir"], *cfg["writable"]], report)
            supervise(cfg, status_fd, report, in_pid_namespace=True)
        finally:
            os._exit(0)  # PID 1 exits: the kernel kills whatever is left in the namespace
    os.close(status_fd)
    _, status = os.waitpid(pid, 0)
    sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    main()
