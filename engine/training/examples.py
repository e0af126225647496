"""FIM training examples: character-level cuts of a file window into prefix / middle / suffix, and the
batches they are collated into (one canvas length per batch).

Every example is a file window cut at CHARACTER positions (so mid-identifier cuts happen, as when the user
is typing): ~45% the rest of a line or a short piece of one, ~35% whole lines or a block body, ~20% a
random span. The encoder reads `<bos> <fim_suffix> suffix <fim_prefix> prefix <fim_middle>` (left
padded); the canvas is `middle <eos> <pad>...` of length L from the buckets. Some examples pin a random
subset or a contiguous run of canvas positions, so the model learns to respect skeletons.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dfim.engine.model.tokenizer import FIM_SPECIALS, Tokenizer, tail_within
from dfim.engine.training.cross_file import CrossFileBlocks, CrossFileSettings, ProjectFiles
from dfim.engine.training.shards import TokenShards


@dataclass
class ExampleSettings:
    context_tokens: int = 512  # encoder input incl. the 4 FIM/bos tokens
    suffix_share: float = 1 / 3  # the suffix gets at most this share; the prefix gets the rest
    buckets: tuple[int, ...] = (16, 32, 64, 128)
    larger_bucket_p: float = 0.5  # put a middle in a larger canvas than it needs (learn long pad runs)
    span_mix: tuple[float, float, float] = (0.45, 0.35, 0.20)  # line, block, random
    short_context_p: float = 0.1  # shrink the context budget (start of file, small windows)
    no_suffix_p: float = 0.08  # writing at the end of a file: nothing after the cursor
    pin_subset_p: float = 0.3  # pin 10-60% of the real canvas positions
    pin_run_p: float = 0.1  # pin one contiguous run (a skeleton such as the rest of a line)
    pad_weight: float = 0.5  # loss weight of the pad positions after EOS
    chars_per_token_budget: float = 6.0  # text taken around the cut, per token of budget (slack)
    # Share of examples whose prefix starts with a block of other files of the project (cross_file.py);
    # needs the data build's manifest.jsonl beside the shards.
    cross_file_p: float = 0.0


@dataclass
class Example:
    context: list[int]
    canvas: list[int]  # middle + eos + pads, length L
    pinned: list[bool]
    middle_len: int  # tokens before eos
    kind: str = ""


class FimExamples:
    """Draws FIM examples from token shards. One instance per data-loader worker."""

    def __init__(
        self,
        shards: TokenShards,
        tok: Tokenizer,
        settings: ExampleSettings,
        rng: random.Random,
        projects: ProjectFiles | None = None,
    ) -> None:
        self.shards, self.tok, self.s, self.rng = shards, tok, settings, rng
        self.blocks = (
            CrossFileBlocks(projects, CrossFileSettings(), rng, self.doc_text)
            if projects is not None and settings.cross_file_p > 0
            else None
        )
        # Sample files by (capped) length, so big files are seen more but do not dominate.
        lengths = np.minimum(shards.lengths, 16384).astype(np.float64)
        keep = shards.lengths >= 8
        weights = np.where(keep, lengths, 0.0)
        self.cum = np.cumsum(weights)
        self.np_rng = np.random.default_rng(rng.getrandbits(64))

    def pick_doc(self) -> int:
        i = int(np.searchsorted(self.cum, self.np_rng.random() * self.cum[-1], side="right"))
        return min(i, len(self.shards) - 1)

    def doc_text(self, i: int) -> str:
        table = self.tok.bytes_table
        return b"".join([table[t] for t in self.shards.doc(i).tolist()]).decode("utf-8", errors="ignore")

    def window_text(self, index: int) -> tuple[str, int, bool, bool]:
        """(text around an anchor token of document `index`, anchor char offset, window starts at file start,
        ends at file end)."""
        doc = self.shards.doc(index)
        n = len(doc)
        a = self.rng.randrange(n)
        lo, hi = max(0, a - self.s.context_tokens - 64), min(n, a + self.s.context_tokens)
        table = self.tok.bytes_table
        before = b"".join([table[i] for i in doc[lo:a].tolist()])
        after = b"".join([table[i] for i in doc[a:hi].tolist()])
        head = before.decode("utf-8", errors="ignore")
        text = head + after.decode("utf-8", errors="ignore")
        return text, len(head), lo == 0, hi == n

    def choose_span(self, text: str, anchor: int) -> tuple[int, int, str]:
        rng = self.rng
        ls = text.rfind("\n", 0, anchor) + 1
        le = text.find("\n", anchor)
        le = len(text) if le < 0 else le
        line = text[ls:le]
        code_start = ls + len(line) - len(line.lstrip(" \t"))
        r = rng.random()
        line_p, block_p, _ = self.s.span_mix
        if r < line_p:  # inline completion: from the cursor to the end of the line, or a piece of it
            s = code_start if rng.random() < 0.25 else rng.randint(code_start, le)
            e = le if rng.random() < 0.65 else min(le, s + rng.randint(1, 40))
            return s, e, "line"
        if r < line_p + block_p:
            header_indent = len(line) - len(line.lstrip(" \t"))
            if line.rstrip().endswith(":") and le < len(text) and rng.random() < 0.7:
                # The body of a block (function, loop, if): the lines indented deeper than its header.
                s = le + 1
                e = s
                pos = s
                while pos < len(text):
                    nl = text.find("\n", pos)
                    nl = len(text) if nl < 0 else nl
                    body_line = text[pos:nl]
                    indent = len(body_line) - len(body_line.lstrip(" \t"))
                    if body_line.strip() and indent <= header_indent:
                        break
                    if body_line.strip():
                        e = nl
                    pos = nl + 1
                if e > s:
                    if rng.random() < 0.5:  # the cursor after the auto-indent
                        first = text[s : text.find("\n", s) if text.find("\n", s) >= 0 else len(text)]
                        s += len(first) - len(first.lstrip(" \t"))
                    return s, e, "block"
            lines = 1 + min(int(rng.expovariate(1 / 3)), 30)
            s = ls if rng.random() < 0.5 else code_start
            e = le
            for _ in range(lines - 1):
                nxt = text.find("\n", e + 1)
                if e >= len(text):
                    break
                e = len(text) if nxt < 0 else nxt
            if e < len(text) and rng.random() < 0.3:
                e += 1  # the middle includes the final newline
            return s, e, "lines"
        s = anchor
        e = min(len(text), s + int(rng.expovariate(1 / 100)))
        return s, e, "random"

    def fit_middle(self, text: str, s: int, e: int, max_tokens: int) -> tuple[list[int], int]:
        """Middle ids of text[s:e] cut to at most max_tokens tokens; returns (ids, new end)."""
        ids = self.tok.encode(text[s:e])
        while len(ids) > max_tokens:
            cut = self.tok.decode(ids[:max_tokens])
            # A cut inside a multi-byte character decodes to U+FFFD: back off until the text matches.
            while cut and not text.startswith(cut, s):
                cut = cut[:-1]
            e = s + len(cut)
            ids = self.tok.encode(cut)
            max_tokens = max_tokens if len(ids) <= max_tokens else max_tokens - 1
        return ids, e

    def example(self, max_middle: int) -> Example:
        s_ = self.s
        index = self.pick_doc()
        text, anchor, at_start, at_end = self.window_text(index)
        s, e, kind = self.choose_span(text, anchor)
        middle, e = self.fit_middle(text, s, e, max_middle)

        budget = s_.context_tokens - FIM_SPECIALS
        if self.rng.random() < s_.short_context_p:
            budget = self.rng.randint(16, budget)
        suffix_budget = int(budget * s_.suffix_share)
        if self.rng.random() < s_.no_suffix_p:
            suffix_text = ""
        else:
            suffix_text = text[e : e + int(suffix_budget * s_.chars_per_token_budget)]
            if not at_end and "\n" in suffix_text:  # end the window on a whole line
                suffix_text = suffix_text[: suffix_text.rfind("\n") + 1]
        suffix = self.tok.encode(suffix_text)[:suffix_budget]
        prefix_budget = budget - len(suffix)
        block = ""
        if self.blocks is not None and self.rng.random() < s_.cross_file_p:
            share = self.rng.uniform(0.1, self.blocks.s.max_share)
            near = text[max(0, s - 600) : e + 300]
            block = self.blocks.block(index, text[s:e], near, int(prefix_budget * share), self.count_tokens)
        prefix_budget -= self.count_tokens(block) if block else 0
        start = max(0, s - int(prefix_budget * s_.chars_per_token_budget))
        prefix_text = text[start:s]
        if (start > 0 or not at_start) and "\n" in prefix_text:  # start the window on a whole line
            prefix_text = prefix_text[prefix_text.find("\n") + 1 :]
        prefix = self.tok.encode(prefix_text)
        if len(prefix) > prefix_budget:  # code denser than the estimate: back to a whole line within budget
            prefix_text = tail_within(prefix_text, prefix_budget, self.count_tokens)
            prefix = self.tok.encode(prefix_text)
        if block:  # encoded together, as the server encodes its block and the file's prefix
            prefix = self.tok.encode(block + prefix_text)
            if len(prefix) + len(suffix) > budget:  # the joint encoding came out longer: no block
                prefix = self.tok.encode(prefix_text)
        context = self.tok.fim_context(prefix, suffix)

        needed = len(middle) + 1
        fits = [b for b in s_.buckets if b >= needed]
        length = fits[0] if self.rng.random() >= s_.larger_bucket_p else self.rng.choice(fits)
        canvas = middle + [self.tok.eos_id] + [self.tok.pad_id] * (length - needed)
        pinned = [False] * length
        r = self.rng.random()
        if r < s_.pin_subset_p and needed > 1:
            share = self.rng.uniform(0.1, 0.6)
            for i in self.rng.sample(range(needed), max(1, int(share * needed))):
                pinned[i] = True
        elif r < s_.pin_subset_p + s_.pin_run_p and needed > 2:
            if self.rng.random() < 0.5:  # the tail of the middle is known (rest of a line), eos included
                first = self.rng.randint(1, needed - 1)
                last = needed
            else:
                first = self.rng.randrange(needed - 1)
                last = self.rng.randint(first + 1, needed)
            for i in range(first, last):
                pinned[i] = True
        return Example(context, canvas, pinned, len(middle), kind + ("+files" if block else ""))

    def count_tokens(self, text: str) -> int:
        return len(self.tok.encode(text))


@dataclass
class Batch:
    context: torch.Tensor  # [B, n] long, left padded
    context_pad: torch.Tensor  # [B, n] bool
    canvas: torch.Tensor  # [B, L] long (clean)
    pinned: torch.Tensor  # [B, L] bool
    weight: torch.Tensor  # [B, L] float: 1 on middle and eos, pad_weight on pads, 0 on pins
    real_tokens: int = 0  # non-pad context tokens + canvas positions (for tokens/s)

    def pin_memory(self) -> Batch:  # called by the DataLoader's pinning thread
        tensors = (self.context, self.context_pad, self.canvas, self.pinned, self.weight)
        return Batch(*(t.pin_memory() for t in tensors), self.real_tokens)

    def to(self, device: torch.device | str) -> Batch:
        nb = torch.device(device).type == "cuda"
        return Batch(
            *(t.to(device, non_blocking=nb) for t in (self.context, self.context_pad, self.canvas)),
            self.pinned.to(device, non_blocking=nb),
            self.weight.to(device, non_blocking=nb),
            self.real_tokens,
        )


def collate(examples: Sequence[Example], n: int, pad_id: int, pad_weight: float) -> Batch:
    b, length = len(examples), len(examples[0].canvas)
    context = torch.full((b, n), pad_id, dtype=torch.long)
    context_pad = torch.ones((b, n), dtype=torch.bool)
    for i, ex in enumerate(examples):
        ctx = ex.context[-n:]
        context[i, n - len(ctx) :] = torch.tensor(ctx)
        context_pad[i, n - len(ctx) :] = False
    canvas = torch.tensor([ex.canvas for ex in examples], dtype=torch.long)
    pinned = torch.tensor([ex.pinned for ex in examples], dtype=torch.bool)
    positions = torch.arange(length)[None]
    middle_len = torch.tensor([ex.middle_len for ex in examples])[:, None]
    weight = torch.where(positions <= middle_len, 1.0, pad_weight) * (~pinned)
    real = int((~context_pad).sum()) + b * length
    return Batch(context, context_pad, canvas, pinned, weight.float(), real)


class BatchStream(torch.utils.data.IterableDataset):
    """Endless batches; examples are grouped by canvas bucket so each batch has one L."""

    def __init__(
        self,
        data_dir: str,
        split: str,
        tokenizer_path: str,
        settings: ExampleSettings,
        batch_size: int,
        seed: int,
    ) -> None:
        super().__init__()
        self.data_dir, self.split, self.tokenizer_path = data_dir, split, tokenizer_path
        self.settings, self.batch_size, self.seed = settings, batch_size, seed

    def __iter__(self) -> Iterator[Batch]:
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        rng = random.Random(self.seed * 1_000_003 + worker)
        tok = Tokenizer.from_file(self.tokenizer_path)
        shards = TokenShards(self.data_dir, self.split)
        projects = (
            ProjectFiles.load(self.data_dir, self.split, len(shards))
            if self.settings.cross_file_p > 0
            else None
        )
        examples = FimExamples(shards, tok, self.settings, rng, projects)
        max_middle = max(self.settings.buckets) - 1
        pools: dict[int, list[Example]] = {b: [] for b in self.settings.buckets}
        while True:
            ex = examples.example(max_middle)
            pool = pools[len(ex.canvas)]
            pool.append(ex)
            if len(pool) == self.batch_size:
                yield collate(pool, self.settings.context_tokens, tok.pad_id, self.settings.pad_weight)
                pools[len(ex.canvas)] = []
