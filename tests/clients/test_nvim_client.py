"""The Neovim plugin against the real server: headless Neovim opens a file, asks `dfim serve` for an inline
completion at a cursor, accepts it, and the buffer must hold exactly the completion the server returned.

A random tiny checkpoint fills garbage, so the test checks the mechanics (the edit lands where the item's
range says, the accept command reaches the server's telemetry), never the text. Skipped without `nvim`
(clients/ci.sh installs it in CI and fails on a skip).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "clients" / "nvim"
DRIVER = PLUGIN / "tests" / "e2e.lua"
FIRST_KEYSTROKE = PLUGIN / "tests" / "first_keystroke.lua"
TOKENIZER = ROOT / "engine" / "weights" / "dfim-small" / "tokenizer.json"

NVIM = shutil.which("nvim")
pytestmark = pytest.mark.skipif(NVIM is None, reason="nvim is not installed (apt-get install neovim)")

SOURCE = (
    "def add(a, b):\n"
    '    """Return the sum of a and b."""\n'
    "    return \n"  # the cursor goes after this space
    "\n\n"
    "def main():\n"
    "    print(add(1, 2))\n"
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from dfim.engine.model.checkpoint import write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("ckpt"), TOKENIZER)


def run_nvim(tmp: Path, checkpoint: Path, row: int, col: int, driver: Path = DRIVER) -> dict:
    file = tmp / "work" / "example.py"
    file.parent.mkdir()
    file.write_text(SOURCE)
    data = tmp / "data"
    result = tmp / "result.json"
    config = {
        "plugin": str(PLUGIN),
        "file": str(file),
        "result": str(result),
        "row": row,
        "col": col,
        "wait_ms": 40000,
        "cmd": [sys.executable, "-m", "dfim", "serve", "--model", str(checkpoint)],
        # two denoising steps: the random model's text does not matter, only the round trip
        "settings": {"sampling": {"maxSteps": 2}, "telemetry": {"dataDir": str(data)}},
    }
    env = {
        **os.environ,
        "DFIM_E2E": json.dumps(config),
        "XDG_STATE_HOME": str(tmp / "state"),
        "XDG_DATA_HOME": str(tmp / "xdg-data"),
        "XDG_CACHE_HOME": str(tmp / "cache"),
        "XDG_CONFIG_HOME": str(tmp / "config"),
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [NVIM, "--headless", "-u", "NONE", "-i", "NONE", "-n", "-c", f"luafile {driver}"],
        cwd=file.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        stdin=subprocess.DEVNULL,
    )
    assert result.exists(), f"nvim wrote no result (rc {proc.returncode}): {proc.stdout}\n{proc.stderr}"
    out = json.loads(result.read_text())
    assert "error" not in out, out["error"]
    out["data_dir"] = data
    return out


def test_inline_completion_accepted_in_neovim(tmp_path, checkpoint):
    row, col = 2, len("    return ")  # the end of the line (the driver sets virtualedit=onemore)
    out = run_nvim(tmp_path, checkpoint, row, col)
    assert out["attached"], out["steps"]
    assert out["ready"], f"server never became ready: {out.get('status')}"
    assert out["status"].get("isRandom") is True
    assert out["shown"], f"no completion shown: {out}"
    assert out["marks"] >= 1  # the ghost text is on screen
    assert out["tab_mapped"]  # <Tab> is an expr mapping: accept when shown, a plain Tab otherwise
    assert out["accepted_word"] is True and out["accepted"] is True
    assert out["marks_after"] == 0

    # The buffer changed by exactly the item: its range replaced by its insertText, on the cursor's line.
    item = out["item"]
    rng = item["range"]
    assert rng["start"]["line"] == rng["end"]["line"] == row
    before = "\n".join(out["before"]) + "\n"
    lines = before.split("\n")
    start = sum(len(line) + 1 for line in lines[:row]) + rng["start"]["character"]
    end = sum(len(line) + 1 for line in lines[:row]) + rng["end"]["character"]
    expected = before[:start] + item["insertText"] + before[end:]
    after = "\n".join(out["after"]) + "\n"
    assert after == expected
    assert after != before
    assert out["text"] and out["text"] in after
    # the cursor ends right after the inserted text
    head = expected[: start + len(item["insertText"])].split("\n")
    assert out["cursor"] == [len(head), len(head[-1].encode())]

    # Accept word took a first piece and left the rest on screen; word + rest is the whole suggestion.
    word = out["text"][: len(out["text"]) - len(out["rest"])]
    assert word and out["rest"] and word + out["rest"] == out["text"]
    assert out["marks_word"] >= 1
    assert "\n".join(out["after_word"]) + "\n" == before[:start] + word + before[start:]

    # The partial accept reached the server's local telemetry, with the word's length.
    events = [json.loads(line) for line in (out["data_dir"] / "telemetry.jsonl").read_text().splitlines()]
    mine = {e["event"]: e for e in events if e["id"] == out["id"]}
    assert "shown" in mine
    assert mine["partial"]["acceptedChars"] == len(word)

    # :DfimStats talks to the same server
    assert out["stats"]["completed"] >= 1
    assert any(line.startswith("state") for line in out["stats_lines"])


def test_the_first_keystroke_of_a_session_gets_a_suggestion(tmp_path, checkpoint):
    """Straight into insert mode after opening the file, while the server still starts and loads the model:
    a suggestion appears with no other key. Then a cursor move in insert mode, a keystroke, entering insert
    mode and an accept each ask again (the plugin's own ghost text, as Neovim 0.12's built-in client does)."""
    row, col = 2, len("    return ")
    out = run_nvim(tmp_path, checkpoint, row, col, driver=FIRST_KEYSTROKE)
    assert out["state_at_insert"] in ("not started", "loading"), out  # the model was not ready yet
    assert out["first"]["text"] and out["first"]["mode"] == "i"
    assert out["moved"]["requests"] >= 2  # one per move
    assert out["typed"]["requests"] >= 1 and out["typed"]["mode"] == "i"
    assert out["entered"]["requests"] >= 1 and out["entered"]["mode"] == "i"
    # <Tab> put the suggestion into the line and the plugin asked at the new cursor (whether the answer is
    # worth showing is the model's and the server's business: speculation, the quality gate)
    assert out["accepted"]["line"] == "    return " + out["first"]["text"].split("\n")[0]
    assert out["accepted"]["requests"] >= 1
    # the request made during the load was held by the server, or made again when the status turned ready
    assert out["stats"]["held_for_model"] >= 1 or out["first"]["requests"] >= 2, out
