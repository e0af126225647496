"""Security promises (docs/security.md), each held by a test that can fail.

- weights only from safetensors: no pickle, `torch.load` or `trust_remote_code` in the code (comments and
  strings aside), and a pickle-only checkpoint is refused without being unpickled;
- only the eval command's sandbox starts processes: no `subprocess`, `os.system`, `exec`/`eval` elsewhere in
  engine/ and server/;
- the server opens no network connection: a `sitecustomize` that records every outgoing connect/DNS lookup is
  loaded into a real `dfim serve` over stdio, which then serves inline completions, code actions, commands;
- telemetry stays local and off means off: nothing is written anywhere under a fresh HOME or the data dir
  while it is off; once on, only `<data dir>/telemetry.jsonl`, with no code in it.
"""

from __future__ import annotations

import io
import pickle  # noqa: F401  (the test builds a malicious pickle below; the product code never imports it)
import shutil
import textwrap
import tokenize
from pathlib import Path

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from tests.robustness_helpers import ServerSession
from tests.server_helpers import ROOT, random_checkpoint

PRODUCT = ("engine", "server", "dfim")
SANDBOX_ALLOWED = {
    "engine/evaluation/sandbox.py",
    "engine/evaluation/sandbox_child.py",  # the sandbox's launcher: forks the supervisor, execs the program
}  # the eval command's sandbox: the one place that starts processes
BENCH_ALLOWED_PREFIX = "dfim/bench/"  # benchmarks start `dfim serve` and read git history (not the server)


def product_files() -> list[Path]:
    return sorted(p for d in PRODUCT for p in (ROOT / d).rglob("*.py"))


def code_tokens(path: Path) -> list[tokenize.TokenInfo]:
    """The file's tokens without comments and string literals (docstrings say "no pickle" on purpose)."""
    skip = {
        tokenize.COMMENT,
        tokenize.STRING,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
    }
    skip |= {
        getattr(tokenize, name)
        for name in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")
        if hasattr(tokenize, name)
    }
    source = path.read_text(encoding="utf-8")
    return [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in skip]


def dotted_names(tokens: list[tokenize.TokenInfo]) -> set[str]:
    """Every `a.b.c` chain of names in the code (and each single name)."""
    out, chain = set(), []
    for t in tokens:
        if t.type == tokenize.NAME:
            if chain and chain[-1] == ".":
                chain.append(t.string)
            else:
                chain = [t.string]
            out.add("".join(chain))
            out.add(t.string)
        elif t.string == "." and chain and chain[-1] != ".":
            chain.append(".")
        else:
            chain = []
    return out


FORBIDDEN = {
    "pickle",
    "cPickle",
    "dill",
    "cloudpickle",
    "joblib",
    "torch.load",
    "trust_remote_code",
    "allow_pickle",
}


def test_no_pickle_torch_load_or_remote_code_in_the_product():
    found = []
    for path in product_files():
        names = dotted_names(code_tokens(path))
        found += [f"{path.relative_to(ROOT)}: {name}" for name in sorted(names & FORBIDDEN)]
    assert not found, found


def test_the_scanner_sees_code_and_ignores_comments_and_strings(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        textwrap.dedent(
            '''\
            """Docstring: we never use pickle or torch.load."""
            # a comment about trust_remote_code
            import torch
            state = torch.load("x.pt")
            '''
        ),
        encoding="utf-8",
    )
    assert dotted_names(code_tokens(sample)) & FORBIDDEN == {"torch.load"}


def test_only_the_sandbox_starts_processes_or_evaluates_code():
    found = []
    for path in product_files():
        rel = str(path.relative_to(ROOT))
        if rel in SANDBOX_ALLOWED or rel.startswith(BENCH_ALLOWED_PREFIX):
            continue
        tokens = code_tokens(path)
        names = dotted_names(tokens)
        for name in ("subprocess", "os.system", "os.popen", "os.execv", "os.execvp", "os.spawnv", "pty"):
            if name in names:
                found.append(f"{rel}: {name}")
        for i, t in enumerate(tokens[:-1]):  # bare exec(...) / eval(...) calls; `model.eval()` is a method
            before = tokens[i - 1].string if i else ""
            if t.string in ("exec", "eval", "compile") and tokens[i + 1].string == "(" and before != ".":
                found.append(f"{rel}:{t.start[0]}: {t.string}(")
    assert not found, found


# The one module that talks to the network, and only when the user points `--model` at the URL of a served
# model (a team's `vllm serve`, decision 84): the default path never imports it.
NETWORK_BY_REQUEST = {"engine/inference/vllm_served.py"}


def test_no_network_modules_in_engine_and_server():
    found = []
    for path in product_files():
        rel = str(path.relative_to(ROOT))
        if rel.startswith("dfim/") or rel in NETWORK_BY_REQUEST:
            continue
        names = dotted_names(code_tokens(path))
        found += [
            f"{rel}: {n}" for n in ("socket", "urllib", "http", "requests", "httpx", "ssl") if n in names
        ]
    assert not found, found


class _Payload:
    """Unpickling this would create `marker` (what a malicious checkpoint would do, but harmless)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_pickle_only_checkpoint_is_refused_without_unpickling(tmp_path):
    from dfim.engine.api import CheckpointError
    from dfim.engine.inference.fill import Engine

    good = random_checkpoint(tmp_path / "good")
    folder = tmp_path / "pickled"
    shutil.copytree(good, folder)
    for shard in list(folder.glob("*.safetensors")) + list(folder.glob("*.index.json")):
        shard.unlink()
    marker = tmp_path / "unpickled-marker"
    import pickle as pickle_module

    (folder / "pytorch_model.bin").write_bytes(pickle_module.dumps(_Payload(marker)))
    with pytest.raises(CheckpointError) as info:
        Engine.load(folder)
    assert "safetensors" in str(info.value)
    assert not marker.exists()


# ---- the real server: no network, telemetry off writes nothing --------------------------------------------

SITECUSTOMIZE = '''
"""Test-only: record (and refuse) every outgoing network call of this process."""
import os
import socket

_log = os.environ["DFIM_NET_LOG"]


def _record(what):
    with open(_log, "a", encoding="utf-8") as f:
        f.write(what + "\\n")


def _refuse(name, original):
    def wrapper(*args, **kwargs):
        _record(f"{name} {args[1:] if name.startswith('socket.') else args}")
        raise OSError(f"test: network call {name} refused")
    return wrapper


socket.socket.connect = _refuse("socket.connect", socket.socket.connect)
socket.socket.connect_ex = _refuse("socket.connect_ex", socket.socket.connect_ex)
socket.socket.sendto = _refuse("socket.sendto", socket.socket.sendto)
socket.create_connection = _refuse("create_connection", socket.create_connection)
socket.getaddrinfo = _refuse("getaddrinfo", socket.getaddrinfo)
with open(os.environ["DFIM_NET_HOOKED"], "a", encoding="utf-8") as f:
    f.write(f"{os.getpid()}\\n")
'''

SECRET = "sup3r_s3cret_identifier"  # document text that must never reach the telemetry file
TELEMETRY_OFF = {
    "sampling": {"maxSteps": 2, "actionMaxSteps": 2, "maxCanvas": 32},
    "telemetry": {"enabled": False},
}

pytestmark_server = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def sandbox_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("security")
    hook = root / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    dirs = {"root": root, "hook": hook, "home": root / "home", "data": root / "data"}
    dirs["home"].mkdir()
    return dirs


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def session(sandbox_dirs, tmp_path_factory):
    checkpoint = random_checkpoint(tmp_path_factory.mktemp("ckpt"))
    d = sandbox_dirs
    s = ServerSession()
    env = {
        "PYTHONPATH": f"{d['hook']}:{ROOT}",
        "DFIM_NET_LOG": str(d["root"] / "net.log"),
        "DFIM_NET_HOOKED": str(d["root"] / "hooked.log"),
        "HOME": str(d["home"]),
        "XDG_DATA_HOME": "",
        "XDG_CACHE_HOME": "",
        "XDG_CONFIG_HOME": "",
    }
    await s.start(checkpoint, d["data"], init_options=TELEMETRY_OFF, env=env)
    assert (await s.wait_state()).state == "ready"
    yield s
    await s.stop()


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


async def use_every_feature(session: ServerSession, uri: str) -> None:
    text = f"def {SECRET}(a, b):\n    pass\n\n\ndef g():\n    return \n"
    session.open(uri, text)
    result = await session.inline(uri, 5, 11)
    assert result is not None and result.items
    item = result.items[0]
    await session.client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=item.command.command, arguments=list(item.command.arguments))
    )
    session.client.protocol.notify("dfim/inlineRejected", {"id": item.command.arguments[0]})
    rng = {"start": {"line": 1, "character": 6}, "end": {"line": 1, "character": 6}}
    try:
        await session.client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="dfim.fillHole", arguments=[uri, rng])
        )
    except JsonRpcException as exc:  # a random model may leave nothing usable: fine, it answered
        assert "dfim" in exc.message
    session.client.text_document_did_close(
        types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    await session.stats()


@pytestmark_server
async def test_the_server_opens_no_network_connection(session, sandbox_dirs):
    await use_every_feature(session, "file:///sec/net.py")
    hooked = (sandbox_dirs["root"] / "hooked.log").read_text(encoding="utf-8").split()
    assert str(session.pid) in hooked  # the recorder really ran inside the server process
    log = sandbox_dirs["root"] / "net.log"
    assert not log.exists(), log.read_text(encoding="utf-8")


@pytestmark_server
async def test_telemetry_off_writes_nothing_and_on_writes_only_locally_without_code(session, sandbox_dirs):
    await use_every_feature(session, "file:///sec/off.py")
    assert files_under(sandbox_dirs["data"]) == [] and files_under(sandbox_dirs["home"]) == []
    session.configure({"telemetry": {"enabled": True}})
    await session.stats()  # the configuration is applied in order, before this answer
    await use_every_feature(session, "file:///sec/on.py")
    assert files_under(sandbox_dirs["data"]) == ["telemetry.jsonl"]
    assert files_under(sandbox_dirs["home"]) == []
    events = (sandbox_dirs["data"] / "telemetry.jsonl").read_text(encoding="utf-8")
    assert '"event":"shown"' in events and '"event":"accepted"' in events
    assert SECRET not in events and "def " not in events and "return" not in events


def test_the_network_recorder_catches_a_connection(sandbox_dirs, tmp_path):
    import subprocess
    import sys

    log = tmp_path / "net.log"
    env = {
        "PYTHONPATH": str(sandbox_dirs["hook"]),
        "DFIM_NET_LOG": str(log),
        "DFIM_NET_HOOKED": str(tmp_path / "h"),
    }
    code = "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\nexcept OSError:\n    pass\n"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert "create_connection" in log.read_text(encoding="utf-8")


def test_the_network_client_is_imported_only_for_a_model_url():
    """No module imports the served-model client at import time: it loads only for an http(s) `--model`."""
    for path in product_files():
        rel = str(path.relative_to(ROOT))
        if rel in NETWORK_BY_REQUEST:
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith(("import ", "from ")):  # module level only; a function may import it lazily
                assert "vllm_served" not in line, f"{rel}: {line}"
