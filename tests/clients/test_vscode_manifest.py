"""The VS Code extension's settings are the server's: every `dfim.*` key the manifest declares (except the
client's own) must exist in `dfim.server.options.Options` with the same default, and every server option must be
declared, so a user sees each knob in the Settings UI and a typo can never reach the server."""

from __future__ import annotations

import json
from pathlib import Path

from dfim.server.options import Options, merge_options, to_json

MANIFEST = Path(__file__).resolve().parents[2] / "clients" / "vscode" / "package.json"
CLIENT_ONLY = ("dfim.serverPath", "dfim.serverArgs", "dfim.trace.server")


def flatten(tree: dict, prefix: str = "dfim") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}.{key}"))
        else:
            out[f"{prefix}.{key}"] = value
    return out


def test_manifest_settings_match_server_options():
    properties = json.loads(MANIFEST.read_text())["contributes"]["configuration"]["properties"]
    declared = {k: v["default"] for k, v in properties.items() if k not in CLIENT_ONLY}
    server = flatten(to_json(Options()))
    assert sorted(declared) == sorted(server)
    for key, default in server.items():
        assert declared[key] == default, key


def test_manifest_defaults_are_accepted_by_the_server():
    properties = json.loads(MANIFEST.read_text())["contributes"]["configuration"]["properties"]
    tree: dict = {}
    for key, spec in properties.items():
        if key in CLIENT_ONLY:
            continue
        *groups, leaf = key.split(".")[1:]
        node = tree
        for group in groups:
            node = node.setdefault(group, {})
        node[leaf] = spec["default"]
    merged, errors = merge_options(Options(), tree)
    assert errors == []
    assert merged == Options()
