"""`dfim tokenizer`: train the byte-level BPE tokenizer on a language-balanced sample of source code.

The sample is Python from .py folders (default: this interpreter's stdlib and site-packages) and, with
`--corpus`, equal shares of every other language in the corpus shards.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dfim.engine.model.tokenizer import VOCAB_SIZE, default_roots, read_corpus_text, read_training_text, train


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="where to write tokenizer.json")
    parser.add_argument("--max-mb", type=float, default=80.0, help="sample at most this many MiB of source")
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE, help="tokens in the vocabulary")
    parser.add_argument("--seed", type=int, default=0, help="seed of the file sample")
    parser.add_argument(
        "--corpus",
        action="extend",
        nargs="+",
        default=[],
        help="corpus shards (.jsonl.xz) of other languages",
    )
    parser.add_argument(
        "--python-share", type=float, default=0.4, help="share of Python in the sample when --corpus is given"
    )
    parser.add_argument(
        "roots",
        nargs="*",
        help="directories of Python files, the Python share of the sample; other languages come from --corpus "
        "(default: stdlib + site-packages)",
    )


def run(args: argparse.Namespace) -> int:
    roots = [Path(r) for r in args.roots] or default_roots()
    t0 = time.time()
    max_bytes = int(args.max_mb * 2**20)
    python_bytes = int(max_bytes * args.python_share) if args.corpus else max_bytes
    samples = {"python": read_training_text(roots, python_bytes, args.seed)}
    if args.corpus:
        for lang, texts in read_corpus_text(
            [Path(c) for c in args.corpus], max_bytes - python_bytes, args.seed
        ).items():
            samples.setdefault(lang, []).extend(texts)
    for lang, texts in sorted(samples.items()):
        print(
            f"  {lang}: {len(texts)} files, {sum(len(t.encode()) for t in texts) / 2**20:.1f} MiB", flush=True
        )
    texts = [t for group in samples.values() for t in group]
    random.Random(args.seed).shuffle(texts)
    nbytes = sum(len(t.encode()) for t in texts)
    print(f"read {len(texts)} files, {nbytes / 2**20:.1f} MiB in {time.time() - t0:.1f}s", flush=True)
    tok = train(texts, args.vocab_size)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(out)
    for lang, group in sorted(samples.items()):
        sample = group[:200]
        chars = sum(len(t) for t in sample)
        ntok = sum(len(ids) for ids in tok.encode_batch(sample))
        print(f"  {lang}: {chars / max(ntok, 1):.2f} chars/token on {len(sample)} training files")
    print(f"vocab {tok.vocab_size}, trained in {time.time() - t0:.1f}s -> {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dfim tokenizer", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
