"""Convert a bf16 (or fp32) checkpoint folder into the int8 format (dfim.engine.model.int8).

    python scripts/quantize_checkpoint.py SOURCE_DIR TARGET_DIR [--max-shard-mib 16]

Prints the bytes of the weights before and after. The result loads wherever a checkpoint folder is taken
(`dfim fill --model`, `dfim eval --model`, `dfim serve`), and runs its products in int8 on x86 CPUs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dfim.engine.api import CheckpointError
from dfim.engine.model.checkpoint import parameter_bytes
from dfim.engine.model.int8 import convert_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="checkpoint folder (HF format, bf16 or fp32)")
    parser.add_argument("target", type=Path, help="new folder for the int8 checkpoint")
    parser.add_argument("--max-shard-mib", type=float, default=16.0, help="largest shard, MiB (default 16)")
    args = parser.parse_args(argv)
    try:
        convert_checkpoint(args.source, args.target, max_shard_bytes=int(args.max_shard_mib * 2**20))
    except (CheckpointError, ValueError, OSError) as err:
        print(f"quantize_checkpoint: {err}", file=sys.stderr)
        return 1
    before, after = parameter_bytes(args.source), parameter_bytes(args.target)
    print(
        f"{args.source}: {before / 1e6:.1f} MB -> {args.target}: {after / 1e6:.1f} MB ({after / before:.0%})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
