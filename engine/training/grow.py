"""Depth up-scaling of a trained network (LLaMA-Pro style): new decoder layers, each a copy of the layer it
follows, that start out contributing nothing, so the grown network computes the same function as the one it
grew from and training continues from the old model's quality instead of from scratch.

What writes into the residual stream in a DiffusionGemma layer (engine/model/network.py, `Layer`):

    x = x + post_attention_layernorm(o_proj(attention))
    x = (x + post_feedforward_layernorm(norm_1(mlp.down_proj(...)) + norm_2(experts.down_proj(...)))) * scalar

`scalar` (the decoder's `layer_scalar` buffer and the encoder's own copy) multiplies the whole residual,
not the branch, so a copy must have it at exactly 1. Each branch ends in an RMSNorm, which is why there are
two ways to silence a copy (`ZERO_MODES`):

- "projections" (LLaMA-Pro's recipe): o_proj, the dense MLP's and every expert's down_proj at zero. Exact at
  init, but the post-norm after them is scale-free: RMSNorm(0) is 0, yet its Jacobian there is
  w / sqrt(eps) (1000 w at eps 1e-6), and any output above ~sqrt(eps) comes out at full scale. One AdamW
  step moves each weight by about the learning rate, so after the first step the copy's branches jump from
  nothing to full scale. Measured on dfim-base grown by 3 layers (fixed FIM batches of the stdlib, the
  training run's AdamW, clip and warm-up: lr 2e-6 on step 1): val loss 1.221 at init, 4.497 after one
  step, 3.521 after four.
- "norms" (default): the two outer post-norms' scales (post_attention_layernorm, post_feedforward_layernorm)
  at zero. Also exact, and the branch output is `w * normalized(...)`, so a copy fades in linearly with `w`
  (a ReZero-style gate) while its projections stay the trained copies. They get no gradient on the very
  first step (w = 0) and do from the second on. Measured as above: 1.2207, 1.2207, 1.2208, 1.2205 after
  0, 1, 2, 4 steps, the same as the 8-layer source trained alike.

Module names stay the checkpoint keys: a copy of layer i inserted as layer j is `model.decoder.layers.j.*`
and `model.encoder.language_model.layers.j.layer_scalar`, and later layers are renumbered.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from dfim.engine.model.checkpoint import MAX_SHARD_BYTES, shard_plan
from dfim.engine.model.config import FULL, SLIDING, ModelConfig
from dfim.engine.model.int8 import is_quantized_key
from dfim.engine.model.network import DiffusionGemma

ZERO_MODES = ("norms", "projections")
# The tensors of a layer (relative to `model.decoder.layers.N.`) each mode sets to zero.
ZEROED: dict[str, tuple[str, ...]] = {
    "norms": ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight"),
    "projections": ("self_attn.o_proj.weight", "mlp.down_proj.weight", "experts.down_proj"),
}
DECODER_LAYER = "model.decoder.layers."
ENCODER_LAYER = "model.encoder.language_model.layers."
_LAYER_KEY = re.compile(r"^(model\.decoder\.layers\.|model\.encoder\.language_model\.layers\.)(\d+)\.(.+)$")

# The on-disk budget of the embedded model (decisions.md 56: the package carries at most 48 MB).
BUDGET_BYTES = 48_000_000


class GrowthError(ValueError):
    """A plan that cannot be applied (a layer index out of range, an unknown mode, over the budget)."""


def check_plan(config: ModelConfig, after: Sequence[int]) -> tuple[int, ...]:
    """`after` as a sorted tuple of layer indices of `config`'s network; GrowthError for one out of range.
    Repeats are allowed: two 3s put two copies of layer 3 after it."""
    n = config.num_hidden_layers
    bad = [i for i in after if not 0 <= int(i) < n]
    if bad:
        raise GrowthError(f"layer {bad[0]} is not a layer of this {n}-layer model (0..{n - 1})")
    if not after:
        raise GrowthError("the plan inserts no layer")
    return tuple(sorted(int(i) for i in after))


def spread_plan(config: ModelConfig, n: int) -> tuple[int, ...]:
    """The default plan for `n` new layers: copies of sliding layers, spread evenly over them (the middle
    of each of `n` equal runs of sliding layers), so no stretch of the stack is deepened twice before
    another once. Sliding layers because they are the architecture's common kind (five of six in the
    released pattern): the full layers stay where they are, the last among them, and the stack keeps its
    ratio of local to global attention. More new layers than sliding ones wraps round (two copies each)."""
    if n < 1:
        raise GrowthError(f"a plan needs at least one new layer (got {n})")
    assert config.layer_types is not None
    sliding = [i for i, t in enumerate(config.layer_types) if t == SLIDING]
    if not sliding:  # an all-full stack: spread over every layer
        sliding = list(range(config.num_hidden_layers))
    return tuple(sorted(sliding[int((k + 0.5) * len(sliding) / n) % len(sliding)] for k in range(n)))


def every_plan(config: ModelConfig, every: int) -> tuple[int, ...]:
    """LLaMA-Pro's plan: a copy after every `every`-th layer (after layers every-1, 2*every-1, ...)."""
    if every < 1:
        raise GrowthError(f"every must be at least 1 (got {every})")
    return tuple(range(every - 1, config.num_hidden_layers, every))


def layer_sources(config: ModelConfig, after: Sequence[int]) -> list[tuple[int, bool]]:
    """Per layer of the grown network: (the old layer it comes from, whether it is a new copy)."""
    plan = check_plan(config, after)
    order: list[tuple[int, bool]] = []
    for i in range(config.num_hidden_layers):
        order.append((i, False))
        order.extend((i, True) for _ in range(plan.count(i)))
    return order


def grown_config(config: ModelConfig, after: Sequence[int]) -> ModelConfig:
    """`config` with the new layers: each copy has its source's type (a copy of a full layer is full), so
    the full layers keep their kind and the last layer stays full (a copy of the last one is full too)."""
    assert config.layer_types is not None
    types = [config.layer_types[i] for i, _ in layer_sources(config, after)]
    if types[-1] != FULL:  # cannot happen from a valid config; said here because the network relies on it
        raise GrowthError("the last layer of the grown network would not be a full-attention layer")
    return replace(config, num_hidden_layers=len(types), layer_types=types)


@torch.no_grad()
def grow(model: DiffusionGemma, after: Sequence[int], zero: str = "norms") -> DiffusionGemma:
    """A new network with a copy of layer i inserted after it for every i in `after` (see `spread_plan`,
    `every_plan`), computing what `model` computes (exactly, in any dtype: the copies add zeros). `model` is
    not changed and shares no memory with the result; dtype, device, train/eval mode and the int8 flag carry
    over. `zero`: which of the copies' residual writers start at zero (`ZERO_MODES`, module docstring)."""
    if zero not in ZERO_MODES:
        raise GrowthError(f"zero must be one of {', '.join(ZERO_MODES)} (got {zero!r})")
    config = grown_config(model.config, after)
    sources = layer_sources(model.config, after)
    old = model.state_dict()
    state: dict[str, Tensor] = {}
    for key, tensor in old.items():
        if _LAYER_KEY.match(key) is None:
            state[key] = tensor.detach().clone()
    for j, (i, new) in enumerate(sources):
        for prefix in (DECODER_LAYER, ENCODER_LAYER):
            source = f"{prefix}{i}."
            for key, tensor in old.items():
                if key.startswith(source):
                    state[f"{prefix}{j}.{key[len(source) :]}"] = tensor.detach().clone()
        if new:
            for name in ZEROED[zero]:
                state[f"{DECODER_LAYER}{j}.{name}"].zero_()
            # multiplies the whole residual, not the branch: anything but 1 would change the function
            state[f"{DECODER_LAYER}{j}.layer_scalar"].fill_(1.0)
            state[f"{ENCODER_LAYER}{j}.layer_scalar"].fill_(1.0)
    with torch.device("meta"):
        grown = DiffusionGemma(config)
    grown.load_state_dict(state, strict=True, assign=True)
    grown.int8_weights = model.int8_weights
    grown.train(model.training)
    return grown


def new_layer_indices(config: ModelConfig, after: Sequence[int]) -> list[int]:
    """The indices the copies get in the grown network."""
    return [j for j, (_, new) in enumerate(layer_sources(config, after)) if new]


# --- size on disk in the int8 format -----------------------------------------------------------------


@dataclass(frozen=True)
class DiskSize:
    """The safetensors files an int8 checkpoint of a config has (`convert_checkpoint`'s layout)."""

    total: int  # bytes of every shard file, headers included (what `parameter_bytes` counts)
    largest_shard: int  # bytes of the largest shard file, header included
    shards: int
    # bytes of the largest stored tensor: one above the shard limit gets a shard of its own
    largest_tensor: int

    def fits(self, budget: int, max_shard_bytes: int) -> bool:
        """Within `budget`, in shards of at most `max_shard_bytes` as `write_shards` counts them (the
        tensors' bytes; each file adds its header, ~10 KB for dfim-base: its largest shard is 15.99 MiB)."""
        return self.total <= budget and self.largest_tensor <= max_shard_bytes


_DTYPE_NAMES = {torch.int8: "I8", torch.bfloat16: "BF16", torch.float32: "F32"}


def int8_disk_size(config: ModelConfig, max_shard_bytes: int = MAX_SHARD_BYTES) -> DiskSize:
    """The size `convert_checkpoint` would write for a model of `config`, from shapes alone (no weights are
    made): int8 matrices with a float32 scale per output channel, everything else bf16, cut into shards as
    `write_shards` cuts them, each with the safetensors header it gets (JSON, padded to 8 bytes)."""
    entries = _int8_entries(config)

    def nbytes(key: str) -> int:
        dtype, shape = entries[key]
        return torch.Size(shape).numel() * dtype.itemsize

    shards = shard_plan({key: nbytes(key) for key in entries}, max_shard_bytes)  # write_shards' cut
    files = [_shard_file_bytes(keys, entries) for keys in shards]
    largest = max(nbytes(key) for key in entries)
    return DiskSize(total=sum(files), largest_shard=max(files), shards=len(files), largest_tensor=largest)


def _int8_entries(config: ModelConfig) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Key -> (stored dtype, shape) of an int8 checkpoint of `config`. The shapes come from a two-layer
    network (one layer of each type) on the meta device, repeated per layer: building the whole network
    for every candidate of `largest_fitting` made a search over a small model's hundreds of layers slow."""
    assert config.layer_types is not None
    probe = replace(config, num_hidden_layers=2, layer_types=[SLIDING, FULL])
    with torch.device("meta"):
        state = DiffusionGemma(probe).state_dict()
    shared: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    per_type: dict[str, dict[tuple[str, str], tuple[torch.dtype, tuple[int, ...]]]] = {SLIDING: {}, FULL: {}}
    for key, tensor in state.items():
        stored: list[tuple[str, torch.dtype, tuple[int, ...]]] = [(key, torch.bfloat16, tuple(tensor.shape))]
        if is_quantized_key(key, tensor):
            stored = [
                (key, torch.int8, tuple(tensor.shape)),
                (f"{key}_scale", torch.float32, (*tensor.shape[:-1], 1)),
            ]
        for name, dtype, shape in stored:
            match = _LAYER_KEY.match(name)
            if match is None:
                shared[name] = (dtype, shape)
            else:
                per_type[probe.layer_types[int(match[2])]][(match[1], match[3])] = (dtype, shape)
    entries = dict(shared)
    for j, kind in enumerate(config.layer_types):
        for (prefix, rest), entry in per_type[kind].items():
            entries[f"{prefix}{j}.{rest}"] = entry
    return entries


def _shard_file_bytes(keys: list[str], entries: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> int:
    """One safetensors file: 8 bytes of header length, the header, the data. safetensors lays the tensors
    out by decreasing alignment, then name, and pads the header with spaces to a multiple of 8."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key in sorted(keys, key=lambda k: (-entries[k][0].itemsize, k)):
        dtype, shape = entries[key]
        end = offset + torch.Size(shape).numel() * dtype.itemsize
        header[key] = {"dtype": _DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    text = len(json.dumps(header, separators=(",", ":")))
    return 8 + text + (-text % 8) + offset


def largest_fitting(
    config: ModelConfig, budget: int = BUDGET_BYTES, max_shard_bytes: int = MAX_SHARD_BYTES
) -> tuple[int, DiskSize | None]:
    """The most new layers `spread_plan` can add to `config` with the int8 checkpoint within `budget` bytes
    in shards of at most `max_shard_bytes` (`DiskSize.fits`), and that checkpoint's size (0 and None when
    none fits)."""

    def size(n: int) -> DiskSize:
        return int8_disk_size(grown_config(config, spread_plan(config, n)), max_shard_bytes)

    # The size grows with every layer (and no copy holds a tensor larger than the source's largest): double
    # until it no longer fits, then bisect, since a small model has room for hundreds of layers.
    ok, over = 0, 1
    while size(over).fits(budget, max_shard_bytes):
        ok, over = over, over * 2
    while over - ok > 1:
        mid = (ok + over) // 2
        ok, over = (mid, over) if size(mid).fits(budget, max_shard_bytes) else (ok, mid)
    return (ok, size(ok)) if ok else (0, None)
