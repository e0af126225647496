"""Train a DiffusionGemma infilling model on token shards from `dfim.engine.training.data`.

    python -m dfim.engine.training.train --data DIR --out RUN [--model-config small] [--minutes 8] [--resume]
    dfim train ...                       (same options)

Objective (DESIGN §2, shaped for infilling). Every example is a file window cut at CHARACTER
positions into prefix / middle / suffix (so mid-identifier cuts happen, as when the user is typing):
~45% the rest of a line or a short piece of one, ~35% whole lines or a block body, ~20% a random
span. The encoder reads `<bos> <fim_suffix> suffix <fim_prefix> prefix <fim_middle>` (left padded);
the canvas is `middle <eos> <pad>...` of length L from the buckets. Uniform-state noise: each
position not pinned is replaced by a uniformly random token with probability t ~ U(t_min, 1). Some
examples pin a random subset or a contiguous run of canvas positions (pins are never noised and
carry no loss), so the model learns to respect skeletons. Half the steps run a first no-grad pass
whose logits self-condition the second.

Resumable in chunks: `--minutes` stops cleanly and saves (`RUN/state/`: model and optimizer as
safetensors, scalars as JSON; nothing is pickled); `--resume` continues. Every run ends with an
HF-format bf16 export (`RUN/export/`, shards of at most 16 MiB) plus tokenizer.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from dfim.engine.model.config import ModelConfig
from dfim.engine.model.tokenizer import FIM_SPECIALS, Tokenizer, tail_within
from dfim.engine.training.data import TokenShards

if TYPE_CHECKING:
    from dfim.engine.model.network import DiffusionGemma

DEFAULT_TOKENIZER = Path(__file__).parents[1] / "weights" / "dfim-small" / "tokenizer.json"

# Model presets. `small` is the shipped candidate (~15.5 M parameters, 31 MB in bf16).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(  # CPU smoke tests: a few hundred thousand parameters outside the embedding
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        global_head_dim=64,
        num_global_key_value_heads=1,
        sliding_window=64,
        num_experts=2,
        top_k_experts=1,
        moe_intermediate_size=64,
    ),
    "small": dict(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=8,  # 5 sliding + 1 full, then 1 sliding + 1 full (the last is always full)
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        global_head_dim=128,
        num_global_key_value_heads=1,
        sliding_window=512,  # covers the whole training context, so sliding == full during training
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=256,
    ),
}


def model_config(spec: str, vocab_size: int, canvas_length: int) -> ModelConfig:
    """A preset name, a JSON file, or inline JSON (flat ModelConfig fields or an HF config.json).

    ValueError (one line) for anything else, for JSON that is not an object and for unknown fields."""
    if spec in PRESETS:
        values: dict[str, Any] = dict(PRESETS[spec])
    else:
        text = spec
        if not spec.lstrip().startswith("{"):
            path = Path(spec)
            if not path.is_file():
                raise ValueError(f"{spec!r} is not a preset ({', '.join(PRESETS)}), a JSON file or JSON")
            text = path.read_text(encoding="utf-8")
        try:
            values = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"not valid JSON ({err})") from None
        if not isinstance(values, dict):
            raise ValueError("expected a JSON object of model config fields")
        if "text_config" in values:
            try:
                return ModelConfig.from_hf(values)
            except (KeyError, TypeError) as err:
                raise ValueError(f"incomplete HF config ({type(err).__name__}: {err})") from None
    values.setdefault("vocab_size", vocab_size)
    values.setdefault("canvas_length", canvas_length)
    return ModelConfig.from_dict(values)


# ----------------------------------------------------------------------------------------------
# Examples: character-level FIM cuts


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
        self, shards: TokenShards, tok: Tokenizer, settings: ExampleSettings, rng: random.Random
    ) -> None:
        self.shards, self.tok, self.s, self.rng = shards, tok, settings, rng
        # Sample files by (capped) length, so big files are seen more but do not dominate.
        lengths = np.minimum(shards.lengths, 16384).astype(np.float64)
        keep = shards.lengths >= 8
        weights = np.where(keep, lengths, 0.0)
        self.cum = np.cumsum(weights)
        self.np_rng = np.random.default_rng(rng.getrandbits(64))

    def pick_doc(self) -> np.ndarray:
        i = int(np.searchsorted(self.cum, self.np_rng.random() * self.cum[-1], side="right"))
        return self.shards.doc(min(i, len(self.shards) - 1))

    def window_text(self) -> tuple[str, int, bool, bool]:
        """(text around an anchor token, anchor char offset, window starts at file start, ends at file end)."""
        doc = self.pick_doc()
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
        text, anchor, at_start, at_end = self.window_text()
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
        start = max(0, s - int(prefix_budget * s_.chars_per_token_budget))
        prefix_text = text[start:s]
        if (start > 0 or not at_start) and "\n" in prefix_text:  # start the window on a whole line
            prefix_text = prefix_text[prefix_text.find("\n") + 1 :]
        prefix = self.tok.encode(prefix_text)
        if len(prefix) > prefix_budget:  # code denser than the estimate: back to a whole line within budget
            prefix_text = tail_within(prefix_text, prefix_budget, lambda t: len(self.tok.encode(t)))
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
        return Example(context, canvas, pinned, len(middle), kind)


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
        examples = FimExamples(TokenShards(self.data_dir, self.split), tok, self.settings, rng)
        max_middle = max(self.settings.buckets) - 1
        pools: dict[int, list[Example]] = {b: [] for b in self.settings.buckets}
        while True:
            ex = examples.example(max_middle)
            pool = pools[len(ex.canvas)]
            pool.append(ex)
            if len(pool) == self.batch_size:
                yield collate(pool, self.settings.context_tokens, tok.pad_id, self.settings.pad_weight)
                pools[len(ex.canvas)] = []


# ----------------------------------------------------------------------------------------------
# Noise, loss, schedule


def add_noise(
    canvas: torch.Tensor,
    pinned: torch.Tensor,
    vocab_size: int,
    t_min: float,
    gen=None,
    ordered_p: float = 0.0,
    pad_id: int = 0,
):
    """Uniform-state forward process: each unpinned position becomes a random token with prob. t.

    `ordered_p` > 0: that share of the rows is noised the way the sampler's left-to-right window
    (`order_window`) leaves a canvas mid-fill instead: clean left of a random cut inside the middle and
    its EOS, noised right of it at a high level t ~ U(0.5, 1) (the sampler renoises every position it did
    not accept). With i.i.d. noise alone the model never trains on the canvases it actually reads."""
    b, length = canvas.shape
    dev = canvas.device
    t = torch.rand(b, 1, device=dev, generator=gen) * (1 - t_min) + t_min
    u = torch.rand(b, length, device=dev, generator=gen)
    flip = u < t
    if ordered_p > 0:  # extra draws only when asked: default runs keep their random stream
        ordered = torch.rand(b, 1, device=dev, generator=gen) < ordered_p
        content = (canvas != pad_id).sum(dim=1, keepdim=True)  # middle + EOS
        cut = (torch.rand(b, 1, device=dev, generator=gen) * (content + 1)).floor()
        right = torch.arange(length, device=dev)[None] >= cut
        flip = torch.where(ordered, right & (u < 0.5 + 0.5 * t), flip)
    flip &= ~pinned
    noise = torch.randint(0, vocab_size, (b, length), device=dev, generator=gen)
    return torch.where(flip, noise, canvas), t


def weighted_loss(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    ce = F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), reduction="none")
    return (ce * weight.flatten()).sum() / weight.sum().clamp(min=1.0)


def lr_at(
    step: int, progress: float, peak: float, warmup: int, decay_share: float, min_ratio: float
) -> float:
    """Warmup-stable-decay: linear warmup, flat, then linear decay over the last `decay_share` of the plan.

    `progress` is the share of the planned run done (steps or seconds), so a run cut into resumable
    chunks of wall time still lands on its decay at the end of the plan."""
    warm = min(1.0, (step + 1) / max(1, warmup))
    if progress <= 1 - decay_share:
        return peak * warm
    frac = min(1.0, (progress - (1 - decay_share)) / max(decay_share, 1e-9))
    return peak * warm * (1 - frac * (1 - min_ratio))


# ----------------------------------------------------------------------------------------------
# State (resume) without pickle


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


# ----------------------------------------------------------------------------------------------
# Training


@dataclass
class Log:
    path: Path
    rows: list[dict[str, Any]] = field(default_factory=list)

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def example_mix(args: argparse.Namespace, settings: ExampleSettings) -> dict[str, Any]:
    """The training stream's span and pin mix from --span-mix / --pin-subset-p (unset: the defaults)."""
    changes: dict[str, Any] = {}
    if getattr(args, "span_mix", None):
        try:
            mix = tuple(float(x) for x in args.span_mix.split(","))
        except ValueError:
            mix = ()
        if len(mix) != 3 or min(mix) < 0 or abs(sum(mix) - 1) > 1e-6:
            raise SystemExit(
                f"--span-mix wants three shares that sum to 1 (line,block,random): {args.span_mix!r}"
            )
        changes["span_mix"] = mix
    pin_p = getattr(args, "pin_subset_p", None)
    if pin_p is not None and settings.pin_subset_p > 0:  # a causal run has no pins to mix
        if not 0 <= pin_p <= 1 - settings.pin_run_p:
            raise SystemExit(f"--pin-subset-p must be in [0, {1 - settings.pin_run_p}]: {pin_p}")
        changes["pin_subset_p"] = pin_p
    return changes


def make_val_batches(args: argparse.Namespace, settings: ExampleSettings, tok_path: str) -> list[Batch]:
    """Fixed validation batches (same files, cuts and noise every time) from the val split."""
    split = "val" if (Path(args.data) / "val_docs.npy").is_file() else "train"
    if split == "val" and len(np.load(Path(args.data) / "val_docs.npy")) == 0:
        split = "train"
    stream = iter(BatchStream(args.data, split, tok_path, settings, args.batch_size, seed=12345))
    return [next(stream) for _ in range(args.val_batches)]


def evaluate(
    fwd, batches: Sequence[Batch], vocab_size: int, pad_id: int, device, autocast, ordered: bool = False
) -> dict[str, float]:
    """Validation loss and content accuracy under i.i.d. noise, or (`ordered`) under the sampler's
    left-to-right pattern on every row."""
    gen = torch.Generator(device=device).manual_seed(0)
    total, weight, correct, count = 0.0, 0.0, 0.0, 0.0
    with torch.no_grad(), autocast():
        for batch in batches:
            b = batch.to(device)
            noisy, _ = add_noise(b.canvas, b.pinned, vocab_size, 0.02, gen, float(ordered), pad_id)
            logits = fwd(b.context, noisy, None, b.context_pad)
            w = b.weight
            ce = F.cross_entropy(logits.flatten(0, 1).float(), b.canvas.flatten(), reduction="none")
            total += float((ce * w.flatten()).sum())
            weight += float(w.sum())
            content = ((b.canvas != pad_id) & ~b.pinned).flatten()  # middle + eos
            correct += float((logits.argmax(-1).flatten() == b.canvas.flatten())[content].sum())
            count += float(content.sum())
    return {"val_loss": total / max(weight, 1.0), "val_acc": correct / max(count, 1.0)}


def causal_sequence(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The AR view of a FIM example: `context middle <eos>` as one sequence (context left padded,
    pads after EOS on the right) -> (ids [B, N], left-pad mask [B, N], target weight [B, N-1]).

    Every real token after the first is a target, context included (the usual FIM language-model
    loss on the whole reordered document), so the AR model learns from all the text it reads."""
    ids = torch.cat([batch.context, batch.canvas], dim=1)
    pad = torch.cat([batch.context_pad, torch.zeros_like(batch.pinned)], dim=1)
    real = torch.cat([~batch.context_pad, batch.weight > 0], dim=1)
    weight = (real[:, 1:] & real[:, :-1]).float()
    return ids, pad, weight


def context_lm_loss(model, hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Next-token loss on the encoder's pass over the context (hidden [B, n, H]): each real context
    token predicts the next one, and `<fim_middle>` (the last) predicts the first token of the clean
    canvas. Left pads neither predict nor are predicted (a real token is never followed by a pad)."""
    targets = torch.cat([batch.context[:, 1:], batch.canvas[:, :1]], dim=1)
    logits = model.logits(hidden)
    return weighted_loss(logits, targets, (~batch.context_pad).float())


def causal_loss(model, batch: Batch) -> torch.Tensor:
    ids, pad, weight = causal_sequence(batch)
    logits = model.causal_forward_train(ids, pad)
    return weighted_loss(logits[:, :-1], ids[:, 1:], weight)


def validate(model, fwd, batches, causal: bool, config: ModelConfig, pad_id: int, device, autocast):
    if not causal:
        scores = evaluate(fwd, batches, config.vocab_size, pad_id, device, autocast)
        ordered = evaluate(fwd, batches, config.vocab_size, pad_id, device, autocast, ordered=True)
        return {**scores, "val_loss_ordered": ordered["val_loss"], "val_acc_ordered": ordered["val_acc"]}
    # AR: loss over every target as in training; accuracy over the middle and its EOS only, the
    # figure comparable to the diffusion model's content accuracy.
    total, weight, correct, count = 0.0, 0.0, 0.0, 0.0
    with torch.no_grad(), autocast():
        for batch in batches:
            b = batch.to(device)
            ids, pad, w = causal_sequence(b)
            logits = model.causal_forward_train(ids, pad)[:, :-1]
            target = ids[:, 1:]
            ce = F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), reduction="none")
            total += float((ce * w.flatten()).sum())
            weight += float(w.sum())
            n = b.context.shape[1]
            middle = w[:, n - 1 :] > 0  # targets inside the canvas: middle + eos
            hit = logits[:, n - 1 :].argmax(-1) == target[:, n - 1 :]
            correct += float(hit[middle].sum())
            count += float(middle.sum())
    return {"val_loss": total / max(weight, 1.0), "val_acc": correct / max(count, 1.0)}


def export(model, out_dir: Path, tok_path: Path, info: dict[str, Any], origin: str | None = None) -> Path:
    """Write the trained weights as a checkpoint. Sampler defaults come from `origin` (the checkpoint the
    run started from) when it is still there, so a continuation keeps e.g. its `window`."""
    from dfim.engine.api import SamplerSettings
    from dfim.engine.model.checkpoint import read_settings, save_model

    settings = SamplerSettings()
    if origin and Path(origin).is_dir():
        settings = read_settings(Path(origin))
    out_dir.mkdir(parents=True, exist_ok=True)
    save_model(model, out_dir, settings, dtype=torch.bfloat16, info=info)
    shutil.copyfile(tok_path, out_dir / "tokenizer.json")
    return out_dir


def default_name(out: str | os.PathLike) -> str:
    """The model name of a run without --name: its --out folder's name."""
    return Path(out).resolve().name or "dfim-small"


def pick_device(name: str | None) -> torch.device:
    """--device, else CUDA where there is one; sets the matmul precision for it."""
    device = torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_flush_denormal(True)  # tiny CPU runs slow down badly on denormal activations
    return device


def example_settings(
    args: argparse.Namespace, buckets: tuple[int, ...]
) -> tuple[ExampleSettings, ExampleSettings]:
    """(the training stream's example settings, validation's). Validation keeps the default mix of spans
    and pins, so val loss compares across runs that train on another mix (a continuation that favours
    single lines, say)."""
    settings = ExampleSettings(
        context_tokens=args.context_tokens, buckets=buckets, pad_weight=args.pad_weight
    )
    if args.objective == "causal":  # no canvas to pin, and a causal model never reads the pads after EOS
        settings = replace(settings, pin_subset_p=0.0, pin_run_p=0.0, pad_weight=0.0)
    return replace(settings, **example_mix(args, settings)), settings


@dataclass
class Run:
    """One training run: the model, its optimizer and the counters carried from step to step (nanoGPT
    keeps these in globals). `step`, `tokens` and `train_seconds` are saved with the state (`scalars`)
    and go on counting after --resume."""

    args: argparse.Namespace
    config: ModelConfig
    model: DiffusionGemma
    optimizer: torch.optim.Optimizer
    device: torch.device
    pad_id: int
    origin: str | None  # the checkpoint this run started from (--init-from), remembered across resumes
    compiled: Any  # torch.compile(model.forward_train_lm); None: eager (also after a compiler failure)
    noise_gen: torch.Generator  # the noise of the diffusion objective
    self_cond_rng: random.Random  # which steps self-condition
    step: int
    tokens: int  # real tokens trained on (non-pad context + canvas)
    train_seconds: float  # time spent in training steps: the clock of a --plan-minutes schedule

    @property
    def causal(self) -> bool:
        return self.args.objective == "causal"

    def fwd_lm(self, context, canvas, self_cond, context_pad, context_lm: bool):
        """The denoiser -> (canvas logits, with `context_lm` the encoder's hidden states over the
        context, else None), compiled when --compile."""
        if self.compiled is None:
            return self.model.forward_train_lm(context, canvas, self_cond, context_pad, context_lm=context_lm)
        # One graph for every canvas bucket instead of one per L (compile time is training time).
        torch._dynamo.mark_dynamic(canvas, 1)
        if self_cond is not None:
            torch._dynamo.mark_dynamic(self_cond, 1)
        return self.compiled(context, canvas, self_cond, context_pad, context_lm=context_lm)

    def fwd(self, context, canvas, self_cond, context_pad):
        """The denoiser's canvas logits alone (the self-conditioning pass, validation)."""
        return self.fwd_lm(context, canvas, self_cond, context_pad, False)[0]

    def autocast(self):
        """bf16 autocast on CUDA; plain fp32 on CPU."""
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    def validate(self, batches: Sequence[Batch]) -> dict[str, float]:
        # No eval()/train() toggling: the network has no dropout, and a changed mode would make
        # torch.compile recompile.
        return validate(
            self.model, self.fwd, batches, self.causal, self.config, self.pad_id, self.device, self.autocast
        )

    def scalars(self) -> dict[str, Any]:
        """trainer.json's fields besides the optimizer's param groups (see `save_state`)."""
        return {
            "step": self.step,
            "tokens": self.tokens,
            "train_seconds": self.train_seconds,
            "model_config": self.config.to_dict(),
            "init_from": self.origin,
            "args": {k: v for k, v in vars(self.args).items() if not k.startswith("_") and not callable(v)},
        }


def setup(args: argparse.Namespace, out: Path, tok: Tokenizer, device: torch.device, max_canvas: int) -> Run:
    """The model and its AdamW: a fresh init (--model-config), a checkpoint's weights (--init-from), or,
    with --resume and a saved state in OUT/state, the saved run with its optimizer and counters."""
    from dfim.engine.model.network import DiffusionGemma

    resuming = args.resume and (out / "state" / "trainer.json").is_file()
    origin = args.init_from
    if resuming:
        saved = json.loads((out / "state" / "trainer.json").read_text())
        config = ModelConfig.from_dict(saved["model_config"])
        origin = saved.get("init_from") or origin
    elif args.init_from:
        from dfim.engine.model.checkpoint import read_config

        config = read_config(Path(args.init_from))
    else:
        config = model_config(args.model_config, tok.vocab_size, max_canvas)
    if config.vocab_size != tok.vocab_size:
        raise SystemExit(f"model vocab {config.vocab_size} != tokenizer vocab {tok.vocab_size}")
    model = DiffusionGemma(config)
    model.init_weights(generator=torch.Generator().manual_seed(args.seed))
    if args.init_from and not resuming:
        from dfim.engine.model.checkpoint import load_model

        loaded, _ = load_model(args.init_from, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
    model.to(device)
    model.train()

    # Weight decay on matrices and embeddings only, not on norms' scales and other vectors.
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=device.type == "cuda",
    )
    step, tokens, train_seconds = 0, 0, 0.0
    if resuming:
        scalars = load_state(out, model, optimizer)
        step, tokens, train_seconds = scalars["step"], scalars["tokens"], scalars["train_seconds"]
        print(f"resumed from {out / 'state'} at step {step} ({tokens:,} tokens)", flush=True)

    compiled = torch.compile(model.forward_train_lm, mode=args.compile_mode) if args.compile else None
    return Run(
        args=args,
        config=config,
        model=model,
        optimizer=optimizer,
        device=device,
        pad_id=tok.pad_id,
        origin=origin,
        compiled=compiled,
        # Seeded by the step too, so a resumed run does not replay the noise of its first chunk.
        noise_gen=torch.Generator(device=device).manual_seed(args.seed * 7 + step),
        self_cond_rng=random.Random(args.seed + step),
        step=step,
        tokens=tokens,
        train_seconds=train_seconds,
    )


def stop_reason(run: Run, deadline: float, plan_seconds: float) -> str | None:
    """Why training stops before the next step ("steps", "time", "plan"), or None to go on."""
    args = run.args
    if args.steps and run.step >= args.steps:
        return "steps"
    if time.time() >= deadline - args.reserve_seconds:  # --minutes, less the time kept for saving
        return "time"
    if args.stop_at_plan and plan_seconds and run.train_seconds >= plan_seconds:
        return "plan"  # the planned GPU minutes are spent (equal-budget comparisons)
    return None


def lr_now(run: Run, plan_seconds: float) -> float:
    """The learning rate of the next step: the WSD schedule at the run's progress through its plan, in
    steps (--total-steps, else --steps) or training seconds (--plan-minutes, else --minutes)."""
    args = run.args
    if args.total_steps or args.steps:
        progress = run.step / (args.total_steps or args.steps)
    elif plan_seconds:
        progress = run.train_seconds / plan_seconds
    else:
        progress = 0.0  # no plan: constant learning rate after warmup
    return lr_at(run.step, progress, args.lr, args.warmup, args.decay_share, args.min_lr_ratio)


def forward_backward(run: Run, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One step's gradients -> (the objective's own loss, the auxiliary LM loss or None).

    causal: the AR FIM loss over `context middle <eos>`. diffusion: noise the canvas; on a share
    --self-cond-p of the steps a first no-grad pass's logits self-condition the second; the weighted
    denoising loss, plus --context-lm-weight x the encoder's next-token loss on the context or
    --causal-weight x the AR FIM loss."""
    args = run.args
    if run.causal:
        with run.autocast():
            loss = causal_loss(run.model, batch)
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return loss, None
    noisy, _ = add_noise(
        batch.canvas,
        batch.pinned,
        run.config.vocab_size,
        args.t_min,
        run.noise_gen,
        args.ordered_noise_p,
        run.pad_id,
    )
    self_cond = None
    if run.self_cond_rng.random() < args.self_cond_p:
        with torch.no_grad(), run.autocast():
            self_cond = run.fwd(batch.context, noisy, None, batch.context_pad).detach()
    context_lm = args.context_lm_weight > 0
    with run.autocast():
        logits, hidden = run.fwd_lm(batch.context, noisy, self_cond, batch.context_pad, context_lm)
    loss = weighted_loss(logits, batch.canvas, batch.weight)
    total, lm = loss, None
    if hidden is not None:
        with run.autocast():
            lm = context_lm_loss(run.model, hidden, batch)
        total = loss + args.context_lm_weight * lm
    if args.causal_weight > 0:
        # The same weights as an AR FIM model over `context middle <eos>`: the draft that serves
        # single lines (decision 38) decodes this way, and the diffusion loss never trains it.
        with run.autocast():
            lm = causal_loss(run.model, batch)
        total = total + args.causal_weight * lm
    run.optimizer.zero_grad(set_to_none=True)
    total.backward()
    # the diffusion loss alone is reported: comparable with runs that have no context LM loss
    return loss, (None if lm is None else lm.detach())


def train_step(run: Run, batch: Batch, lr: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimizer step at learning rate `lr` (gradients clipped) -> forward_backward's losses."""
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    try:
        loss, lm = forward_backward(run, batch)
    except Exception as err:  # a compiler failure must not cost the run: fall back to eager
        if run.compiled is None or run.step > 0:
            raise
        print(f"torch.compile failed ({type(err).__name__}: {err}); continuing without it", flush=True)
        run.compiled = None
        loss, lm = forward_backward(run, batch)
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.args.grad_clip)
    run.optimizer.step()
    return loss, lm


@dataclass
class LogWindow:
    """Sums over the steps since the last train_log.jsonl row."""

    loss: float = 0.0
    lm: float = 0.0  # the auxiliary LM loss (context LM or causal FIM)
    steps: int = 0
    tokens: int = 0
    t0: float = field(default_factory=time.time)

    def add(self, loss: float, lm: torch.Tensor | None, tokens: int) -> None:
        self.loss += loss
        if lm is not None:
            self.lm += float(lm)
        self.steps += 1
        self.tokens += tokens


def log_window(
    run: Run, window: LogWindow, log: Log, lr: float, canvas: int, t_start: float, val_batches: list[Batch]
) -> None:
    """Write the window's row to train_log.jsonl (validation scores every --eval-every steps) and print it."""
    args = run.args
    dt = max(time.time() - window.t0, 1e-9)
    row = {
        "step": run.step,
        "loss": window.loss / window.steps,
        "lr": lr,
        "tok_per_s": window.tokens / dt,
        "tokens": run.tokens,
        "elapsed_s": round(time.time() - t_start, 1),
        "canvas": canvas,  # the last step's canvas length
    }
    if (args.context_lm_weight > 0 or args.causal_weight > 0) and not run.causal:
        row["lm_loss"] = window.lm / window.steps
    if val_batches and (run.step % args.eval_every == 0):
        row.update(run.validate(val_batches))
    log.write(row)
    extra = f" lm {row['lm_loss']:.4f}" if "lm_loss" in row else ""
    if "val_loss" in row:
        extra += f" val {row['val_loss']:.4f} acc {row['val_acc']:.3f}"
    if "val_loss_ordered" in row:
        extra += f" ordered {row['val_loss_ordered']:.4f}"
    print(
        f"step {run.step} loss {row['loss']:.4f}{extra} lr {lr:.2e} tok/s {row['tok_per_s']:,.0f} "
        f"tokens {run.tokens:,} t {row['elapsed_s']}s",
        flush=True,
    )


def export_run(run: Run, final: dict[str, Any], tok_path: Path) -> Path:
    """The run's export (--export, default OUT/export), with what was trained and how far in dfim.json."""
    args = run.args
    random_weights = run.step == 0 and not run.origin
    if random_weights:
        print("warning: no training step ran: the export holds untrained (random) weights", flush=True)
    info = {
        "name": args.name or default_name(args.out),
        "random": random_weights,
        "objective": args.objective,
        **({"context_lm_weight": args.context_lm_weight} if args.context_lm_weight > 0 else {}),
        **({"causal_weight": args.causal_weight} if args.causal_weight > 0 else {}),
        **({"ordered_noise_p": args.ordered_noise_p} if args.ordered_noise_p > 0 else {}),
        "context_tokens": args.context_tokens,
        "step": run.step,
        "tokens": run.tokens,
        "train_seconds": round(run.train_seconds, 1),
        "data": str(args.data),
        **{k: v for k, v in final.items() if k.startswith("val")},
    }
    export_dir = Path(args.export) if args.export else Path(args.out) / "export"
    export(run.model, export_dir, tok_path, info, run.origin)
    return export_dir


def train(args: argparse.Namespace) -> dict[str, Any]:
    """One training run (or the next chunk of a resumed one) as the options say -> the final log row
    (step, tokens, stop reason, val scores) with every step's loss and the export folder."""
    t_start = time.time()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # data-loader workers fork this process
    deadline = t_start + args.minutes * 60 if args.minutes else float("inf")
    torch.manual_seed(args.seed)
    device = pick_device(args.device)
    if not 0 <= args.ordered_noise_p <= 1 or (args.objective == "causal" and args.ordered_noise_p > 0):
        raise SystemExit(f"--ordered-noise-p must be in [0, 1] on a diffusion run: {args.ordered_noise_p}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok_path = Path(args.tokenizer)
    tok = Tokenizer.from_file(tok_path)
    meta_path = Path(args.data) / "meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get("vocab_size") not in (None, tok.vocab_size):
            raise SystemExit(f"{args.data} was tokenized with another vocabulary ({meta['vocab_size']})")
    buckets = tuple(sorted(int(b) for b in args.buckets.split(",")))
    if args.objective == "causal" and (args.context_lm_weight > 0 or args.causal_weight > 0):
        raise SystemExit("--context-lm-weight and --causal-weight are for the diffusion objective")
    settings, val_settings = example_settings(args, buckets)

    run = setup(args, out, tok, device, max(buckets))
    plan_seconds = (args.plan_minutes or args.minutes or 0) * 60
    val_batches = make_val_batches(args, val_settings, str(tok_path)) if args.val_batches else []
    # Seeded by the step too, so a resumed run reads other examples than its first chunk did.
    stream = BatchStream(
        args.data, "train", str(tok_path), settings, args.batch_size, seed=args.seed + run.step
    )
    loader = torch.utils.data.DataLoader(
        stream,
        batch_size=None,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        prefetch_factor=8 if args.workers else None,
        persistent_workers=False,
    )
    log = Log(out / "train_log.jsonl")
    n_params = run.model.num_parameters()
    print(
        f"model {n_params / 1e6:.2f} M parameters ({n_params * 2 / 2**20:.1f} MiB bf16), device {device}, "
        f"batch {args.batch_size} x context {args.context_tokens} + canvas {buckets}, "
        f"compile {bool(args.compile)}, workers {args.workers}",
        flush=True,
    )

    last_save = time.time()
    window = LogWindow()
    losses: list[float] = []
    it = iter(loader)
    while True:
        stop = stop_reason(run, deadline, plan_seconds)
        if stop:
            break
        t0 = time.time()
        batch = next(it).to(device)
        lr = lr_now(run, plan_seconds)
        loss, lm = train_step(run, batch, lr)
        run.step += 1
        run.tokens += batch.real_tokens
        loss_value = float(loss.detach())  # syncs: keeps the step time honest
        losses.append(loss_value)
        window.add(loss_value, lm, batch.real_tokens)
        run.train_seconds += time.time() - t0

        if run.step % args.log_every == 0 or run.step == 1:
            log_window(run, window, log, lr, int(batch.canvas.shape[1]), t_start, val_batches)
            window = LogWindow()
        if args.save_every_minutes and time.time() - last_save > args.save_every_minutes * 60:
            save_state(out, run.model, run.optimizer, run.scalars())
            last_save = time.time()

    del it, loader  # ends the data-loader workers
    final = {"step": run.step, "tokens": run.tokens, "stop": stop}
    if val_batches:
        final.update(run.validate(val_batches))
    save_state(out, run.model, run.optimizer, run.scalars())
    log.write({"final": True, **final, "elapsed_s": round(time.time() - t_start, 1)})
    export_dir = export_run(run, final, tok_path)
    print(
        f"stopped ({stop}) at step {run.step}; state in {out / 'state'}, export in {export_dir}",
        flush=True,
    )
    return {**final, "losses": losses, "export": str(export_dir)}


# ----------------------------------------------------------------------------------------------
# Command line (python -m dfim.engine.training.train, dfim train)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", required=True, help="token shards from `python -m dfim.engine.training.data`"
    )
    parser.add_argument("--out", required=True, help="run folder: state/, train_log.jsonl, export/")
    parser.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER))
    parser.add_argument(
        "--model-config", default="small", help=f"preset {sorted(PRESETS)}, JSON file or JSON"
    )
    parser.add_argument("--init-from", help="start from the weights of this checkpoint folder")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/state if it exists")
    parser.add_argument("--export", help="export folder (default OUT/export)")
    parser.add_argument(
        "--name", default=None, help="model name written to dfim.json (default: the --out folder's name)"
    )
    parser.add_argument("--minutes", type=float, default=0.0, help="wall-clock limit of this run (0 = none)")
    parser.add_argument(
        "--plan-minutes", type=float, default=0.0, help="training time planned over all chunks (lr schedule)"
    )
    parser.add_argument("--total-steps", type=int, default=0, help="plan in steps instead of minutes")
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps in total (0 = none)")
    parser.add_argument("--reserve-seconds", type=float, default=20.0, help="kept for saving and export")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--context-tokens", type=int, default=512)
    parser.add_argument("--buckets", default="16,32,64,128", help="canvas lengths")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--min-lr-ratio", type=float, default=0.1)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument(
        "--decay-share", type=float, default=0.25, help="WSD: share of the plan spent decaying"
    )
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument(
        "--objective",
        choices=("diffusion", "causal"),
        default="diffusion",
        help="diffusion: the shipped infilling objective; causal: the same network as an AR FIM model",
    )
    parser.add_argument("--pad-weight", type=float, default=0.5, help="loss weight of pads after EOS")
    parser.add_argument(
        "--span-mix",
        default=None,
        help="training spans as line,block,random shares (default 0.45,0.35,0.20; validation keeps it)",
    )
    parser.add_argument(
        "--pin-subset-p",
        type=float,
        default=None,
        help="share of training examples with 10-60%% of the canvas pinned (default 0.3)",
    )
    parser.add_argument(
        "--stop-at-plan", action="store_true", help="stop once --plan-minutes of training are spent"
    )
    parser.add_argument(
        "--context-lm-weight",
        type=float,
        default=0.0,
        help="diffusion: weight of a next-token loss on the encoder's context pass (0 = off)",
    )
    parser.add_argument(
        "--causal-weight",
        type=float,
        default=0.0,
        help="diffusion: weight of an AR FIM loss on `context middle <eos>`, which trains the draft (0 = off)",
    )
    parser.add_argument("--t-min", type=float, default=0.02, help="smallest noise level sampled")
    parser.add_argument(
        "--ordered-noise-p",
        type=float,
        default=0.0,
        help="share of rows noised left-to-right as the sampler's window leaves them (clean up to a cut)",
    )
    parser.add_argument("--self-cond-p", type=float, default=0.5)
    parser.add_argument("--workers", type=int, default=min(12, max(0, (os.cpu_count() or 2) - 2)))
    parser.add_argument("--device", default=None)
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile (default: on GPU)",
    )
    parser.add_argument(
        "--compile-mode", default=None, help="torch.compile mode (e.g. max-autotune-no-cudagraphs)"
    )
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=500, help="validation every N steps (at log steps)")
    parser.add_argument("--val-batches", type=int, default=8)
    parser.add_argument("--save-every-minutes", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)


# The encoder input holds the 4 FIM tokens and, on short-context examples, a budget drawn from [16, rest].
MIN_CONTEXT_TOKENS = FIM_SPECIALS + 16
MIN_DOC_TOKENS = 8  # shorter files are never drawn (FimExamples)


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad options before any data or model is loaded: InputError, whose message is the one line
    `dfim train` prints (exit 2). Reads the tokenizer, the shard index and the model config only."""
    from dfim.commands.checks import (
        InputError,
        at_least,
        existing_dir,
        existing_file,
        output_folder,
        positive,
        within,
    )
    from dfim.engine.api import EngineError
    from dfim.engine.inference.fill import check_device
    from dfim.engine.model.checkpoint import read_config
    from dfim.engine.model.network import DiffusionGemma

    at_least("--batch-size", args.batch_size, 1)
    at_least("--steps", args.steps, 0)  # 0: no step limit
    at_least("--total-steps", args.total_steps, 0)
    at_least("--minutes", args.minutes, 0)  # 0: no time limit
    at_least("--plan-minutes", args.plan_minutes, 0)
    at_least("--reserve-seconds", args.reserve_seconds, 0)
    if args.minutes and args.minutes * 60 <= args.reserve_seconds:
        raise InputError(
            f"--minutes {args.minutes} leaves no training time: {args.reserve_seconds:g} s of it are kept "
            "for saving (--reserve-seconds)"
        )
    at_least("--context-tokens", args.context_tokens, MIN_CONTEXT_TOKENS)
    positive("--lr", args.lr)
    within("--min-lr-ratio", args.min_lr_ratio, 0, 1)
    at_least("--warmup", args.warmup, 0)
    within("--decay-share", args.decay_share, 0, 1)
    at_least("--weight-decay", args.weight_decay, 0)
    positive("--grad-clip", args.grad_clip)
    at_least("--pad-weight", args.pad_weight, 0)
    at_least("--context-lm-weight", args.context_lm_weight, 0)
    at_least("--causal-weight", args.causal_weight, 0)
    within("--t-min", args.t_min, 0, 1, open_high=True)
    within("--self-cond-p", args.self_cond_p, 0, 1)
    within("--ordered-noise-p", args.ordered_noise_p, 0, 1)
    at_least("--workers", args.workers, 0)
    at_least("--log-every", args.log_every, 1)
    at_least("--eval-every", args.eval_every, 1)
    at_least("--val-batches", args.val_batches, 0)
    at_least("--save-every-minutes", args.save_every_minutes, 0)
    if args.objective == "causal" and args.context_lm_weight > 0:
        raise InputError("--context-lm-weight is for the diffusion objective (a causal run's loss is all LM)")
    if args.context_lm_weight > 0 and args.causal_weight > 0:
        raise InputError("--causal-weight already trains the context's next tokens: drop --context-lm-weight")
    if args.objective == "causal" and args.causal_weight > 0:
        raise InputError("--causal-weight is for the diffusion objective (a causal run's loss is all LM)")
    if args.objective == "causal" and args.ordered_noise_p > 0:
        raise InputError("--ordered-noise-p is for the diffusion objective")
    mix = ExampleSettings()
    if args.objective == "causal":
        mix = replace(mix, pin_subset_p=0.0, pin_run_p=0.0)
    try:
        example_mix(args, mix)
    except SystemExit as err:
        raise InputError(str(err.code)) from None
    try:
        buckets = sorted({int(b) for b in args.buckets.split(",") if b.strip()})
    except ValueError:
        buckets = []
    if not buckets or buckets[0] < 2:
        raise InputError(
            f"--buckets wants canvas lengths of at least 2, comma-separated (e.g. 16,32,64,128): {args.buckets!r}"
        )
    if args.device is not None:
        try:
            check_device(args.device)
        except EngineError as err:
            raise InputError(f"--device: {err}") from None

    output_folder(args.out, "--out")
    if args.export:
        output_folder(args.export, "--export")
    tok_path = existing_file(args.tokenizer, "--tokenizer")
    try:
        tok = Tokenizer.from_file(tok_path)
    except Exception as err:  # tokenizers raises its own Exception subclass
        raise InputError(f"--tokenizer {tok_path}: not a usable tokenizer.json ({err})") from None

    data = existing_dir(args.data, "--data")
    index = data / "train_docs.npy"
    if not index.is_file():
        raise InputError(
            f"--data {data}: no token shards (train_docs.npy); build them with "
            f"`python -m dfim.engine.training.data --out {data} --tokenizer ...`"
        )
    try:
        docs = np.load(index)
    except (OSError, ValueError, EOFError) as err:
        raise InputError(f"--data {data}: unreadable shard index train_docs.npy ({err})") from None
    if docs.ndim != 2 or docs.shape[1] != 3:
        raise InputError(f"--data {data}: train_docs.npy is not a shard index (shape {docs.shape})")
    if not (docs[:, 2] >= MIN_DOC_TOKENS).any():
        raise InputError(
            f"--data {data}: no training files ({len(docs)} in the train split, none of {MIN_DOC_TOKENS}+ tokens)"
        )
    for shard in sorted({int(i) for i in docs[:, 0]}):
        if not (data / f"train_{shard:03d}.bin").is_file():
            raise InputError(f"--data {data}: shard train_{shard:03d}.bin is missing")
    try:
        meta = json.loads((data / "meta.json").read_text()) if (data / "meta.json").is_file() else {}
    except (OSError, ValueError):
        meta = {}
    if isinstance(meta, dict) and meta.get("vocab_size") not in (None, tok.vocab_size):
        raise InputError(
            f"--data {data} was tokenized with another vocabulary ({meta['vocab_size']} tokens, "
            f"--tokenizer has {tok.vocab_size})"
        )

    resuming = args.resume and (Path(args.out) / "state" / "trainer.json").is_file()
    if resuming:
        return  # the model is the saved run's
    if args.init_from:
        folder = existing_dir(args.init_from, "--init-from")
        try:
            config = read_config(folder)
        except EngineError as err:
            raise InputError(f"--init-from: {err}") from None
        what = f"--init-from {folder}"
    else:
        try:
            config = model_config(args.model_config, tok.vocab_size, max(buckets))
        except (ValueError, TypeError) as err:
            raise InputError(f"--model-config: {err}") from None
        what = "--model-config"
    if config.vocab_size != tok.vocab_size:
        raise InputError(
            f"{what}: model vocabulary {config.vocab_size} != tokenizer vocabulary {tok.vocab_size}"
        )
    try:
        with torch.device("meta"):  # shapes only: no memory, no time
            DiffusionGemma(config)
    except Exception as err:  # a config that names impossible shapes
        raise InputError(f"{what}: cannot build this model ({type(err).__name__}: {err})") from None


def run(args: argparse.Namespace) -> int:
    from dfim.commands.checks import InputError, fail
    from dfim.engine.api import EngineError

    try:
        check_args(args)
    except InputError as err:
        return fail("dfim train", str(err))
    if args.compile is None:
        args.compile = torch.cuda.is_available() and (args.device or "cuda") != "cpu"
    try:
        train(args)
    except EngineError as err:  # a checkpoint (--init-from) whose weights cannot be read
        return fail("dfim train", str(err))
    except SystemExit as err:  # train's own refusals (option combinations) carry their message
        if isinstance(err.code, str):
            return fail("dfim train", err.code)
        raise
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dfim.engine.training.train", description=__doc__.split("\n\n")[0]
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
