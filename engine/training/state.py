"""Resumable training state without pickle: model and optimizer tensors as safetensors, scalars as JSON."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch


def save_state(
    out: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scalars: dict[str, Any]
) -> None:
    from safetensors.torch import save_file

    tmp, final, old = out / "state.tmp", out / "state", out / "state.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
        str(tmp / "model.safetensors"),
    )
    names = {id(p): n for n, p in model.named_parameters()}
    tensors: dict[str, torch.Tensor] = {}
    groups = []
    for group in optimizer.param_groups:
        groups.append(
            {
                "params": [names[id(p)] for p in group["params"]],
                **{k: v for k, v in group.items() if k != "params"},
            }
        )
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                tensors[f"{names[id(p)]}::{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    (tmp / "trainer.json").write_text(json.dumps({**scalars, "param_groups": groups}, indent=1) + "\n")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def load_state(out: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Inverse of `save_state`; the optimizer gets a regular state_dict (so device/dtype rules apply)."""
    from safetensors.torch import load_file

    state = out / "state"
    scalars = json.loads((state / "trainer.json").read_text())
    model.load_state_dict(load_file(str(state / "model.safetensors")), strict=True)
    tensors = load_file(str(state / "optimizer.safetensors"))
    per_param: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    for key, t in tensors.items():
        name, _, what = key.partition("::")
        per_param[name][what] = t
    saved_groups = scalars.pop("param_groups")
    names = {id(p): n for n, p in model.named_parameters()}
    current = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
    if [g["params"] for g in saved_groups] != current:
        raise ValueError(f"{state}: optimizer parameters do not match this model")
    index = 0
    groups, opt_state = [], {}
    for saved in saved_groups:
        ids = []
        for name in saved["params"]:
            if name in per_param:
                opt_state[index] = per_param[name]
            ids.append(index)
            index += 1
        group = {k: (tuple(v) if k == "betas" else v) for k, v in saved.items() if k != "params"}
        groups.append({**group, "params": ids})
    optimizer.load_state_dict({"state": opt_state, "param_groups": groups})
    return scalars
