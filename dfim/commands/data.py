"""`dfim data`: token shards for training from source trees, C/C++ headers and corpus shards.

Options are checked before anything is read; the build itself is `dfim.engine.training.data.build`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from dfim.commands.checks import (
    InputError,
    at_least,
    existing_dir,
    existing_file,
    fail,
    output_folder,
    within,
)
from dfim.engine.training.data import BuildError, build, expand_shard_patterns
from dfim.engine.training.decontamination import EvalFilter, find_eval_dirs
from dfim.engine.training.provenance import Root, classify_root, default_roots
from dfim.engine.training.shards import is_built

prog = "dfim data"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, type=Path, help="folder for the token shards")
    parser.add_argument("--tokenizer", required=True, type=Path, help="tokenizer.json to encode with")
    parser.add_argument(
        "--roots",
        nargs="*",
        type=Path,
        help="folders to read (default: stdlib + site-packages); a plain folder, such as your own "
        "repository, gives the files of every language the server serves",
    )
    parser.add_argument("--extra-roots", nargs="*", type=Path, default=[], help="folders added to the roots")
    parser.add_argument(
        "--corpus", action="extend", nargs="+", default=[], help="corpus shards (.jsonl.xz; globs expanded)"
    )
    parser.add_argument(
        "--c-headers", action="extend", nargs="+", type=Path, default=[], help="folders of C/C++ headers"
    )
    parser.add_argument(
        "--permissive-only", action="store_true", help="drop .py files under a non-permissive licence too"
    )
    parser.add_argument("--no-near-dedup", action="store_true", help="exact and whitespace dedup only")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="processes that read and encode"
    )
    parser.add_argument(
        "--val-fraction", type=float, default=0.01, help="share of files held out for validation"
    )
    parser.add_argument("--max-shard-tokens", type=int, default=2**26, help="tokens per shard file")
    parser.add_argument("--eval-data", type=Path, nargs="*", help="HumanEval-style folders to exclude")
    parser.add_argument(
        "--hold-out",
        nargs="*",
        default=[],
        help="top-level packages or modules of the folders to leave out, to evaluate on them later",
    )
    parser.add_argument("--skip-if-built", action="store_true", help="do nothing if DIR already matches")


def run(args: argparse.Namespace) -> int:
    corpus = expand_shard_patterns(args.corpus)
    try:
        output_folder(args.out, "--out")
        existing_file(args.tokenizer, "--tokenizer")
        try:
            from dfim.engine.model.tokenizer import Tokenizer

            Tokenizer.from_file(args.tokenizer)
        except Exception as err:  # tokenizers raises its own Exception subclass
            raise InputError(f"--tokenizer {args.tokenizer}: not a usable tokenizer.json ({err})") from None
        for flag, paths in (
            ("--roots", args.roots),
            ("--extra-roots", args.extra_roots),
            ("--c-headers", args.c_headers),
            ("--eval-data", args.eval_data),
        ):
            for path in paths or ():
                existing_dir(path, flag)
        for path in corpus:
            existing_file(path, "--corpus")
        at_least("--workers", args.workers, 1)
        within("--val-fraction", args.val_fraction, 0, 1, open_low=True, open_high=True)
        at_least("--max-shard-tokens", args.max_shard_tokens, 1)
    except InputError as err:
        return fail(prog, str(err))
    roots = [classify_root(r) for r in args.roots] if args.roots else default_roots()
    roots += [classify_root(r) for r in args.extra_roots]
    roots += [Root(r, "headers") for r in args.c_headers]
    roots += [Root(r, "shard") for r in corpus]
    if args.skip_if_built and is_built(args.out, args.tokenizer, roots):
        print(f"{args.out}: already built for this tokenizer and these roots")
        return 0
    eval_dirs = args.eval_data if args.eval_data is not None else find_eval_dirs()
    try:
        build(
            args.out,
            args.tokenizer,
            roots,
            workers=max(1, args.workers),
            val_fraction=args.val_fraction,
            max_shard_tokens=args.max_shard_tokens,
            eval_filter=EvalFilter.load(eval_dirs),
            permissive_only=args.permissive_only,
            near_dedup=not args.no_near_dedup,
            hold_out=frozenset(args.hold_out),
        )
    except BuildError as err:
        return fail(prog, str(err))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
