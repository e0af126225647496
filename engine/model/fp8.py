"""FP8 (and our int8) checkpoints with scales, dequantized at load time.

A scaled FP8 checkpoint stores each quantized weight `W` as float8 values `q` plus a float scale `s`,
with `W ~= q * s`. The scale lives next to the weight (`X.weight` -> `X.weight_scale`, or the
fine-grained/DeepSeek name `X.weight_scale_inv`, which despite its name is also multiplied; a fused
expert tensor `X.gate_up_proj` -> `X.gate_up_proj_scale[_inv]`) and has one of these shapes:

- per tensor: one value (`[]`, `[1]`, `[1, 1]`);
- per output channel: `[out, 1]` or `[out]` (fbgemm_fp8, compressed-tensors `channel`), per expert
  and channel for 3-D expert tensors `[E, out, 1]`;
- per block: `[ceil(out / bm), ceil(in / bn)]` (transformers `fp8` with `weight_block_size`,
  compressed-tensors `block`/`group`), `[E, ...]` in front for expert tensors.

`config.json` names the method in `quantization_config.quant_method`; we accept the FP8 flavours of
the methods transformers and vLLM write and refuse the rest, because dequantizing an int4 or NVFP4
file as if it were FP8 would give a model that loads fine and outputs garbage.

We run the network in the load dtype (bf16 on a GPU), so weights are expanded once here and the
activation / KV-cache scales such files also carry (`input_scale`, `k_scale`, ...) are not needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dfim.engine.model.int8 import INT8_METHOD

# The methods we can dequantize, as spelled in `quantization_config.quant_method` (normalised:
# lower case, "-" -> "_").
SUPPORTED_METHODS = ("fp8", "fbgemm_fp8", "compressed_tensors", "modelopt", INT8_METHOD)

# Scale key suffixes, tried in this order. Both are multipliers (see the module doc).
SCALE_SUFFIXES = ("_scale", "_scale_inv")

# Keys that only matter to FP8 matmul kernels (static activation scales, KV-cache scales, fbgemm's
# activation bound). Dequantized weights run in the load dtype, so these are skipped.
UNUSED_SUFFIXES = (
    ".input_scale",
    ".input_scale_ub",
    ".activation_scale",
    ".output_scale",
    ".k_scale",
    ".v_scale",
    ".q_scale",
    ".prob_scale",
)

# Dequantize this many elements at a time, so the float32 temporary of a 26B checkpoint's largest
# expert tensor (about 250 M values) stays at 64 MB instead of 1 GB.
CHUNK_ELEMENTS = 1 << 24


class QuantizationError(ValueError):
    """A quantization config or scale we cannot use; the message is one line for a person."""


@dataclass(frozen=True)
class Quantization:
    method: str  # normalised quant_method
    # Block sizes the config declares (rows, cols); used to read block scales whose grid was rounded
    # up (a 1000-row weight with 128-row blocks has 8 scale rows). Empty = infer from the grid.
    blocks: tuple[tuple[int, int], ...] = ()


def _method_name(value: Any) -> str:
    return str(value).strip().lower().replace("-", "_")


def _block(value: Any, what: str) -> tuple[int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise QuantizationError(f"{what} must be two integers, got {value!r}")
    try:
        rows, cols = int(value[0]), int(value[1])
    except (TypeError, ValueError):
        raise QuantizationError(f"{what} must be two integers, got {value!r}") from None
    if rows <= 0 or cols <= 0:
        raise QuantizationError(f"{what} must be positive, got {value!r}")
    return rows, cols


def _compressed_tensors_blocks(config: dict[str, Any]) -> tuple[tuple[int, int], ...]:
    """Check every compressed-tensors scheme is 8-bit float weights; collect its block sizes."""
    fmt = config.get("format")
    # "float-quantized" is the FP8 format; "naive-quantized" stores the dtype as is (FP8 when the
    # weights are type float, 8 bits). Packed formats (int4, NVFP4, 2:4 sparse) are a different layout.
    if fmt is not None and fmt not in ("float-quantized", "naive-quantized"):
        raise QuantizationError(
            f"compressed-tensors format {fmt!r} is not supported (only float-quantized FP8)"
        )
    groups = config.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise QuantizationError("compressed-tensors quantization_config has no config_groups")
    blocks: list[tuple[int, int]] = []
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            raise QuantizationError(f"compressed-tensors group {name!r} has no weights scheme")
        kind, bits = weights.get("type"), weights.get("num_bits")
        if kind != "float" or bits != 8:
            raise QuantizationError(
                f"compressed-tensors group {name!r} quantizes weights as {bits}-bit {kind}; only 8-bit float (FP8) is supported"
            )
        if weights.get("symmetric") is False:
            raise QuantizationError(
                f"compressed-tensors group {name!r} is asymmetric (zero points); not supported"
            )
        strategy = weights.get("strategy") or "tensor"
        if strategy == "block" and weights.get("block_structure") is not None:
            blocks.append(_block(weights["block_structure"], f"group {name!r} block_structure"))
        elif strategy == "group" and weights.get("group_size"):
            blocks.append((1, int(weights["group_size"])))
        elif strategy not in ("tensor", "channel", "block", "group"):
            raise QuantizationError(
                f"compressed-tensors group {name!r} has weight strategy {strategy!r}; not supported"
            )
    return tuple(blocks)


def parse_quantization(config: dict[str, Any]) -> Quantization | None:
    """The `quantization_config` of a `config.json`, or None when the checkpoint is not quantized."""
    raw = config.get("quantization_config")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise QuantizationError("quantization_config must be a JSON object")
    if "quant_method" not in raw:
        raise QuantizationError("quantization_config has no quant_method")
    method = _method_name(raw["quant_method"])
    if method == "fp8":
        if raw.get("fmt") not in (None, "e4m3", "e5m2"):
            raise QuantizationError(f"fp8 fmt {raw['fmt']!r} is not supported (e4m3 or e5m2)")
        size = raw.get("weight_block_size")
        return Quantization(method, () if size is None else (_block(size, "weight_block_size"),))
    if method == INT8_METHOD:
        # dfim.engine.model.int8: symmetric int8 with per-output-channel scales, the same layout as fbgemm_fp8
        bits = raw.get("bits", 8)
        if bits != 8 or raw.get("symmetric", True) is not True:
            raise QuantizationError(
                f"{INT8_METHOD} with bits={bits!r} symmetric={raw.get('symmetric')!r}: only 8-bit symmetric"
            )
        return Quantization(method)
    if method == "fbgemm_fp8":
        return Quantization(method)  # per-channel scales, no blocks
    if method == "compressed_tensors":
        return Quantization(method, _compressed_tensors_blocks(raw))
    if method == "modelopt":
        # ModelOpt writes the algorithm either flat or under "quantization" (hf_quant_config.json style).
        nested = raw.get("quantization") if isinstance(raw.get("quantization"), dict) else {}
        algo = raw.get("quant_algo") or nested.get("quant_algo")
        if str(algo).upper() != "FP8":
            raise QuantizationError(f"modelopt quant_algo {algo!r} is not supported (only FP8)")
        return Quantization(method)
    raise QuantizationError(
        f"quant_method {raw['quant_method']!r} is not supported; dfim dequantizes FP8 and its own int8 checkpoints only "
        f"({', '.join(m.replace('_', '-') if m == 'compressed_tensors' else m for m in SUPPORTED_METHODS)})"
    )


def scale_keys(key: str) -> list[str]:
    """Names a checkpoint may give the scale of weight `key`, most common first."""
    stem = key.removesuffix(".weight") if key.endswith(".weight") else None
    if stem is not None:
        return [f"{stem}.weight{suffix}" for suffix in SCALE_SUFFIXES]
    return [f"{key}{suffix}" for suffix in SCALE_SUFFIXES]


def looks_like_scale(key: str) -> bool:
    return key.endswith(SCALE_SUFFIXES)


def is_unused_aux(key: str) -> bool:
    """Activation / KV-cache scales of kernels we do not run."""
    return key.endswith(UNUSED_SUFFIXES)


def is_float8(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point and dtype.itemsize == 1


def scale_as_float(scale: torch.Tensor) -> torch.Tensor:
    # ue8m0 scales (`scale_fmt: "ue8m0"`) are powers of two stored as a biased exponent byte, either
    # as torch's float8_e8m0fnu (converts exactly) or as raw uint8 (2 ** (byte - 127)).
    if scale.dtype == torch.uint8:
        return torch.exp2(scale.to(torch.float32) - 127.0)
    if not scale.dtype.is_floating_point:
        raise QuantizationError(f"scale has dtype {scale.dtype}, expected a float")
    return scale.to(torch.float32)


def _pick_block(
    rows: int, cols: int, grid: tuple[int, int], declared: Sequence[tuple[int, int]]
) -> tuple[int, int] | None:
    """Block size (bm, bn) of a scale grid over a rows x cols matrix, or None if it fits none.

    A block size the config declares must be the one used (a grid that fits another one is a broken
    file, not a different layout); only a config that declares none lets the grid say, and then the
    blocks must divide the matrix."""
    for bm, bn in declared:
        if (math.ceil(rows / bm), math.ceil(cols / bn)) == grid:
            return bm, bn
    if not declared and grid[0] and grid[1] and rows % grid[0] == 0 and cols % grid[1] == 0:
        return rows // grid[0], cols // grid[1]
    return None


def scale_layout(
    shape: Sequence[int], scale_shape: Sequence[int], blocks: Sequence[tuple[int, int]] = ()
) -> tuple[tuple[int, int, int], tuple[int, int] | None]:
    """How a scale of `scale_shape` covers a weight of `shape`: the scale viewed as [N, R, C] (each
    dim either the weight's or 1) and None, or for block scales its [N, rows/bm, cols/bn] grid and the
    block (bm, bn). Only shapes are read, so a loader can check a whole folder before any data.
    Raises QuantizationError when the scale fits none of the layouts."""
    shape, scale_shape = tuple(shape), tuple(scale_shape)
    if len(shape) not in (2, 3):
        raise QuantizationError(f"scaled weight has shape {shape}; only 2-D and 3-D weights are supported")
    weight3 = shape if len(shape) == 3 else (1, *shape)
    n, rows, cols = weight3
    s = scale_shape
    if math.prod(s) == 1:
        s = (1,) * len(shape)
    elif len(s) < len(shape) and s == shape[: len(s)]:
        # A lower-rank scale indexes the leading dims: [out] per channel, [E] per expert, [E, out].
        s = s + (1,) * (len(shape) - len(s))
    if len(s) != len(shape):
        raise QuantizationError(f"scale of shape {scale_shape} does not fit a weight of shape {shape}")
    s3 = s if len(s) == 3 else (1, *s)
    if all(a in (1, b) for a, b in zip(s3, weight3, strict=True)):
        return s3, None
    block = _pick_block(rows, cols, (s3[1], s3[2]), blocks) if s3[0] in (1, n) else None
    if block is None:
        hint = f" (config block sizes {[list(b) for b in blocks]})" if blocks else ""
        raise QuantizationError(
            f"scale of shape {scale_shape} is neither per-tensor, per-channel nor per-block "
            f"for a weight of shape {shape}{hint}"
        )
    return s3, block


def dequantize(
    weight: torch.Tensor,
    scale: torch.Tensor,
    dtype: torch.dtype,
    blocks: Sequence[tuple[int, int]] = (),
) -> torch.Tensor:
    """`weight * scale` in `dtype`, the scale broadcast per tensor, per channel or per block.

    Works on 2-D weights `[out, in]` and 3-D expert weights `[E, out, in]`, on whatever device the
    tensors are on. Raises QuantizationError when the scale's shape fits none of the layouts."""
    shape = tuple(weight.shape)
    s3_shape, block = scale_layout(shape, tuple(scale.shape), blocks)
    s3 = scale_as_float(scale).to(weight.device).reshape(s3_shape)
    w3 = weight.reshape((1, *shape) if weight.ndim == 2 else shape)
    n, rows, cols = w3.shape
    col_index = torch.arange(cols, device=weight.device) // block[1] if block else None

    out = torch.empty((n, rows, cols), dtype=dtype, device=weight.device)
    step = max(1, CHUNK_ELEMENTS // max(1, cols))
    for e in range(n):
        se = s3[e if s3.shape[0] == n else 0]
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            if block is None or col_index is None:
                piece = se[r0:r1] if se.shape[0] == rows else se
            else:
                row_index = torch.arange(r0, r1, device=weight.device) // block[0]
                piece = se.index_select(0, row_index).index_select(1, col_index)
            out[e, r0:r1] = (w3[e, r0:r1].to(torch.float32) * piece).to(dtype)
    return out.reshape(shape)
