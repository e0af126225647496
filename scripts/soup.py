"""Average the weights of checkpoints that share a parent (a "model soup") into a new checkpoint folder.

    python scripts/soup.py OUT CKPT_A CKPT_B [CKPT_C ...] [--weights 0.5,0.5]

Fine-tunes of one checkpoint usually stay in one basin of the loss, where their average can score better
than each of them. Every checkpoint must have the same config (checked key by key, shape by shape by the
loader). The sampler defaults, tokenizer and dfim.json come from the first; dfim.json gains a `soup` entry
naming the parts and weights. The result is bf16 shards like any export.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dfim.engine.model.checkpoint import load_model, read_config, save_model  # noqa: E402


def soup(out: Path, parts: list[Path], weights: list[float]) -> Path:
    configs = [read_config(p).to_dict() for p in parts]
    if any(c != configs[0] for c in configs[1:]):
        raise SystemExit(
            "the checkpoints have different configs: only fine-tunes of one network can be averaged"
        )
    model, settings = load_model(parts[0], dtype=torch.float32)
    total = {k: v.clone() * weights[0] for k, v in model.state_dict().items()}
    for part, w in zip(parts[1:], weights[1:], strict=True):
        other, _ = load_model(part, dtype=torch.float32)
        for k, v in other.state_dict().items():
            total[k] += w * v
    model.load_state_dict(total)
    info = json.loads((parts[0] / "dfim.json").read_text()) if (parts[0] / "dfim.json").is_file() else {}
    info["soup"] = [{"from": str(p), "weight": w} for p, w in zip(parts, weights, strict=True)]
    for key in ("val_loss", "val_acc", "val_loss_ordered", "val_acc_ordered"):
        info.pop(key, None)  # the parts' numbers, not the soup's
    save_model(model, out, settings, info=info)
    shutil.copy(parts[0] / "tokenizer.json", out / "tokenizer.json")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("parts", type=Path, nargs="+")
    parser.add_argument("--weights", default=None, help="comma-separated, summing to 1 (default: uniform)")
    args = parser.parse_args()
    if len(args.parts) < 2:
        raise SystemExit("a soup needs at least two checkpoints")
    weights = [1 / len(args.parts)] * len(args.parts)
    if args.weights:
        weights = [float(w) for w in args.weights.split(",")]
        if len(weights) != len(args.parts) or abs(sum(weights) - 1) > 1e-6:
            raise SystemExit("--weights wants one weight per checkpoint, summing to 1")
    print(soup(args.out, args.parts, weights))
    return 0


if __name__ == "__main__":
    sys.exit(main())
