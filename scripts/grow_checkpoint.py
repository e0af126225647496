"""Grow a checkpoint deeper (dfim.engine.training.grow): copies of existing layers that start silent, so the
grown model fills exactly as the source does until training moves it.

    python scripts/grow_checkpoint.py SOURCE_DIR TARGET_DIR [--layers N | --after 1,3,6 | --every 4]
        [--zero norms|projections] [--budget-mb 48] [--dry-run]

Where the copies go: `--after I,J` puts a copy of layer I right after it (original numbering, repeats
allowed); `--every K` after every K-th layer (LLaMA-Pro); `--layers N` (the default plan, N = 1) spreads N
copies of sliding layers evenly over the sliding layers (`grow.spread_plan`: dfim-base's S S S S S F S F
grows after layers 1, 3 and 6 for N = 3). A copy has its source's attention type, so the full layers keep
theirs and the last layer stays full.

An int8 source (the shipped models) is read dequantized; the target is written in float32 then, so
converting it back (`scripts/quantize_checkpoint.py`) gives the source's integers exactly; a float source's
target keeps its dtype (`--dtype` to choose). dfim.json keeps the source's notes (context_tokens: a training run
`--init-from` the target trains on the same context) and records the plan under "growth".

Prints the parameters and the size the target would have as int8 (what ships), refuses a plan over the
budget (--budget-mb, default 48 MB, 10^6 bytes, of safetensors shards of at most --max-shard-mib), and
reports the most layers `--layers` could add within it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from dfim.engine.api import CheckpointError
from dfim.engine.model.checkpoint import MAX_SHARD_BYTES, load_model, read_config, read_info, save_model
from dfim.engine.model.config import FULL, ModelConfig
from dfim.engine.model.int8 import INT8_METHOD
from dfim.engine.model.network import DiffusionGemma
from dfim.engine.training.distributed import active_parameters
from dfim.engine.training.grow import (
    BUDGET_BYTES,
    ZERO_MODES,
    GrowthError,
    check_plan,
    every_plan,
    grow,
    grown_config,
    int8_disk_size,
    largest_fitting,
    new_layer_indices,
    spread_plan,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def pattern(types: list[str] | None) -> str:
    return " ".join("F" if t == FULL else "S" for t in types or [])


def parameters(config: ModelConfig) -> tuple[int, int]:
    """(all, active per token) of a network of `config`, from shapes alone."""
    with torch.device("meta"):
        model = DiffusionGemma(config)
    return model.num_parameters(), active_parameters(model)


def layer_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer indices like 1,3,6, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="checkpoint folder (bf16, fp32 or int8)")
    parser.add_argument("target", type=Path, help="new folder for the grown checkpoint")
    plan = parser.add_mutually_exclusive_group()
    plan.add_argument("--layers", type=int, default=None, help="new layers, spread over the sliding ones")
    plan.add_argument("--after", type=layer_list, default=None, help="a copy after each of these layers")
    plan.add_argument("--every", type=int, default=None, help="a copy after every K-th layer")
    parser.add_argument(
        "--zero",
        choices=ZERO_MODES,
        default="norms",
        help="what starts at zero in a copy: its post-norm scales (default) or its output projections",
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: see above")
    parser.add_argument("--name", default=None, help="model name in dfim.json (default SOURCE-NAME-<L>l)")
    parser.add_argument("--budget-mb", type=float, default=BUDGET_BYTES / 1e6, help="int8 size limit, MB")
    parser.add_argument(
        "--max-shard-mib", type=float, default=MAX_SHARD_BYTES / 2**20, help="largest shard, MiB"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan and sizes, write nothing")
    args = parser.parse_args(argv)
    budget, shard = int(args.budget_mb * 1e6), int(args.max_shard_mib * 2**20)
    try:
        return grow_folder(args, budget, shard)
    except (CheckpointError, GrowthError, OSError) as err:
        print(f"grow_checkpoint: {err}", file=sys.stderr)
        return 1


def grow_folder(args: argparse.Namespace, budget: int, shard: int) -> int:
    source, target = args.source, args.target
    if source.resolve() == target.resolve():
        raise GrowthError("grow into a new folder: the source's shards would be overwritten")
    config = read_config(source)
    if args.after is not None:
        after = check_plan(config, args.after)
    elif args.every is not None:
        after = check_plan(config, every_plan(config, args.every))
    else:
        after = spread_plan(config, 1 if args.layers is None else args.layers)
    new = grown_config(config, after)
    before, size = int8_disk_size(config, shard), int8_disk_size(new, shard)
    fits, fit_size = largest_fitting(config, budget, shard)
    print(f"source {source}: {config.num_hidden_layers} layers ({pattern(config.layer_types)})")
    print(
        f"plan: a copy after layer{'s' if len(after) > 1 else ''} {', '.join(map(str, after))} "
        f"(zeroed: {args.zero}) -> {new.num_hidden_layers} layers ({pattern(new.layer_types)}), "
        f"new: {', '.join(map(str, new_layer_indices(config, after)))}"
    )
    print(
        f"int8 on disk: {before.total / 1e6:.2f} MB -> {size.total / 1e6:.2f} MB in {size.shards} shards "
        f"(largest {size.largest_shard / 2**20:.2f} MiB); budget {budget / 1e6:g} MB"
    )
    if fit_size is not None:
        print(
            f"most layers --layers can add within the budget: {fits} "
            f"({fit_size.total / 1e6:.2f} MB, largest shard {fit_size.largest_shard / 2**20:.2f} MiB)"
        )
    else:
        print("no layer can be added within the budget")
    (total, active), (total_new, active_new) = parameters(config), parameters(new)
    print(
        f"parameters: {total / 1e6:.2f} M -> {total_new / 1e6:.2f} M "
        f"({active / 1e6:.2f} M -> {active_new / 1e6:.2f} M active per token)"
    )
    if not size.fits(budget, shard):
        raise GrowthError(
            f"the grown model would be {size.total / 1e6:.2f} MB as int8 (largest shard "
            f"{size.largest_shard / 2**20:.2f} MiB), over the {budget / 1e6:g} MB budget: at most {fits} "
            "new layers fit"
        )

    if args.dry_run:
        return 0
    model, settings = load_model(source, dtype=torch.float32)
    grown = grow(model, after, zero=args.zero)

    info = read_info(source)
    quantized = info.pop("quantization", None) == INT8_METHOD or model.int8_weights
    info.pop("quantized_from", None)  # the target is a float checkpoint again
    stored = json.loads((source / "config.json").read_text(encoding="utf-8")).get("dtype")
    dtype = DTYPES[args.dtype or ("float32" if quantized else stored if stored in DTYPES else "bfloat16")]
    name = str(info.get("name") or source.name)
    info["name"] = args.name or f"{name}-{new.num_hidden_layers}l"
    info["random"] = False
    info["growth"] = {
        "from": name,
        "source": str(source),
        "source_layers": config.num_hidden_layers,
        "layers": new.num_hidden_layers,
        "after": list(after),
        "new_layers": new_layer_indices(config, after),
        "zero": args.zero,
        "int8_bytes": size.total,
    }
    save_model(grown, target, settings, max_shard_bytes=shard, dtype=dtype, info=info)
    if (source / "tokenizer.json").is_file():
        shutil.copyfile(source / "tokenizer.json", target / "tokenizer.json")
    print(f"wrote {target} ({str(dtype).removeprefix('torch.')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
