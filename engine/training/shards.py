"""Token shards on disk: the builder writes them (`ShardWriter`), the trainer memory-maps them back.

{train,val}_NNN.bin   uint16 token ids, whole files each followed by <file_sep>
{train,val}_docs.npy  int64 [N, 3]: shard, start offset, length (without the separator)
meta.json             tokenizer hash, vocabulary size and the sources they were built from
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np


class HasPath(Protocol):
    path: Path


class ShardWriter:
    def __init__(self, out: Path, split: str, sep_id: int, max_tokens: int) -> None:
        self.out, self.split, self.sep_id, self.max_tokens = out, split, sep_id, max_tokens
        self.shard = 0
        self.parts: list[np.ndarray] = []
        self.size = 0
        self.docs: list[tuple[int, int, int]] = []
        self.tokens = 0

    def add(self, ids: np.ndarray) -> None:
        if self.size and self.size + len(ids) + 1 > self.max_tokens:
            self.flush()
        self.docs.append((self.shard, self.size, len(ids)))
        self.parts += [ids, np.array([self.sep_id], dtype=np.uint16)]
        self.size += len(ids) + 1
        self.tokens += len(ids)

    def flush(self) -> None:
        if self.parts:
            np.concatenate(self.parts).tofile(self.out / f"{self.split}_{self.shard:03d}.bin")
            self.shard += 1
        self.parts, self.size = [], 0

    def close(self) -> None:
        self.flush()
        docs = np.array(self.docs, dtype=np.int64).reshape(-1, 3)
        np.save(self.out / f"{self.split}_docs.npy", docs)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class TokenShards:
    """Memory-mapped token shards of one split; `doc(i)` gives one file's ids."""

    def __init__(self, folder: str | Path, split: str) -> None:
        folder = Path(folder)
        self.docs = np.load(folder / f"{split}_docs.npy")
        n_shards = int(self.docs[:, 0].max()) + 1 if len(self.docs) else 0
        self.shards = [
            np.memmap(folder / f"{split}_{i:03d}.bin", dtype=np.uint16, mode="r") for i in range(n_shards)
        ]
        self.lengths = self.docs[:, 2]
        self.num_tokens = int(self.lengths.sum())

    def __len__(self) -> int:
        return len(self.docs)

    def doc(self, i: int) -> np.ndarray:
        shard, start, length = (int(x) for x in self.docs[i])
        return self.shards[shard][start : start + length]


def is_built(folder: str | Path, tokenizer_path: str | Path, roots: Sequence[HasPath] | None = None) -> bool:
    """Shards in `folder` match this tokenizer (and, when given, were built from these roots)."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    same_roots = roots is None or meta.get("roots") == [str(r.path) for r in roots]
    return (
        meta.get("tokenizer_sha256") == file_sha256(Path(tokenizer_path))
        and (folder / "train_docs.npy").is_file()
        and same_roots
    )
