"""1-byte weights: the `dfim_int8` checkpoint format and fbgemm's int8 products on the CPU.

Format: every matrix of the network (2-D `X.weight`, the experts' 3-D `gate_up_proj` / `down_proj`, the
tied embedding that is also the LM head) is stored as int8 `q` in [-127, 127] with a float32 scale per
output channel `s` (`X.weight_scale` [out, 1], `X.gate_up_proj_scale` [E, out, 1]), symmetric, so
`W ~= q * s`. Norms, layer scalars and the router's per-expert vectors stay as they were (bf16): they are a
few thousand values and every one of them scales a whole row. `config.json` carries
`quantization_config = {"quant_method": "dfim_int8", ...}`; the loader (engine/model/checkpoint.py) reads it
through the same scale machinery as scaled FP8 files (engine/model/fp8.py: the scale names and layouts are
the same), dequantizing to the load dtype, and `DiffusionGemma.prepare_cpu_inference` re-packs the matrices
for fbgemm's int8 GEMM (`pack_int8`): re-quantizing `q * s` per channel gives back exactly `q`, so the
products run on the stored integers.

Why int8 on the CPU: at this size a product reads its weights once per pass, and on some machines the int8
GEMMs are 2-4x faster than the fp32 or fp16-weight products. On others `torch._int_mm`, the several-row
route, has no fast kernel: on a 2-core AMD EPYC (AVX2, no VNNI) with torch 2.13 it took 574 ms for a
[512, 512] x [512, 1536] product that fp32 does in 19 ms. So `int8_products_fast` times it once against the
fallback, fbgemm's fp16 copies, and the int8 products are used only where they win (decision 135).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

INT8_METHOD = "dfim_int8"
QMAX = 127  # symmetric: -128 is never used, so -q is always representable

# Files of a checkpoint folder that a conversion copies unchanged (tokenizer.json is rewritten compact).
COPIED_FILES = ("generation_config.json", "dfim.json")


def write_compact_json(source: Path, target: Path) -> None:
    """`source`'s JSON without indentation: the same value in fewer bytes (a tokenizer.json written by
    `tokenizers` is indented: 1.11 MB against 0.46 MB compact for dfim-base's, which counts toward the
    package's 48 MB for model data)."""
    value = json.loads(source.read_text(encoding="utf-8"))
    target.write_text(json.dumps(value, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")


def quantization_config() -> dict[str, Any]:
    """The `quantization_config` entry of an int8 checkpoint's config.json."""
    return {
        "quant_method": INT8_METHOD,
        "bits": 8,
        "symmetric": True,
        "granularity": "per_output_channel",
        "scale_dtype": "float32",
    }


def is_quantized_key(key: str, tensor: Tensor) -> bool:
    """Whether an int8 checkpoint stores this state-dict entry as int8 + scale: matrices, not vectors."""
    return tensor.ndim in (2, 3) and tensor.is_floating_point()


def quantize_per_channel(weight: Tensor) -> tuple[Tensor, Tensor]:
    """`weight` [out, in] or [E, out, in] -> int8 values of the same shape and float32 scales [out, 1] /
    [E, out, 1], symmetric (`max |row| -> 127`). An all-zero row gets scale 1 (its values are 0 anyway)."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    q = torch.round(w / scale).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def quantize_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A state dict in the int8 format: matrices as int8 with `<key>_scale`, everything else as bf16."""
    out: dict[str, Tensor] = {}
    for key, tensor in state.items():
        if is_quantized_key(key, tensor):
            q, scale = quantize_per_channel(tensor)
            out[key] = q.contiguous()
            out[f"{key}_scale"] = scale.contiguous()
        elif tensor.is_floating_point():
            out[key] = tensor.detach().to("cpu", torch.bfloat16).contiguous()
        else:
            out[key] = tensor.detach().cpu().contiguous()
    return out


def convert_checkpoint(source: str | Path, target: str | Path, max_shard_bytes: int = 16 * 2**20) -> Path:
    """Write an int8 copy of the checkpoint folder `source` (bf16 or fp32, HF format) into `target`:
    safetensors shards of at most `max_shard_bytes`, config.json with `quantization_config`, and the
    tokenizer, generation config and notes copied. Every key and shape is checked by loading `source`
    first, so a broken folder fails here, not at the first fill."""
    from dfim.engine.model.checkpoint import load_model, read_info, write_shards

    source, target = Path(source), Path(target)
    if source.resolve() == target.resolve():
        raise ValueError("convert into a new folder: the source's shards would be overwritten")
    model, _ = load_model(source, dtype=torch.float32)
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    if config.get("quantization_config") is not None:
        method = config["quantization_config"].get("quant_method")
        raise ValueError(f"{source} is already quantized ({method}); convert the bf16 checkpoint")
    target.mkdir(parents=True, exist_ok=True)
    write_shards(quantize_state(model.state_dict()), target, max_shard_bytes)
    config["quantization_config"] = quantization_config()
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in COPIED_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)
    if (source / "tokenizer.json").is_file():
        write_compact_json(source / "tokenizer.json", target / "tokenizer.json")
    info = read_info(source)
    if info:  # the notes say which checkpoint this one was made from
        info = {**info, "quantized_from": str(info.get("name") or source.name), "quantization": INT8_METHOD}
        (target / "dfim.json").write_text(json.dumps(info, indent=2) + "\n")
    return target


@dataclass(frozen=True)
class Int8Weight:
    """A [out, in] weight's stored integers in the two layouts the int8 products read."""

    fbgemm: object  # torch.ops.quantized.linear_prepack's packed weight (one row: `linear_dynamic`)
    transposed: Tensor  # int8 [in, out], contiguous: `torch._int_mm`'s right operand
    scale: Tensor  # float32 [out]: per output channel


def pack_int8(weight: Tensor) -> Int8Weight | None:
    """`weight` [out, in] (fp32, int8 values times per-channel scales) packed for `linear_int8`, or None where
    the int8 kernels are missing (a torch build without fbgemm / the x86 quantized engine)."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        return None
    if torch.backends.quantized.engine not in ("x86", "fbgemm"):
        return None
    q, scale = quantize_per_channel(weight)
    q = q.contiguous()  # fused and transposed matrices arrive as strided views
    try:
        with warnings.catch_warnings():
            # torch marks quantized tensor types deprecated; they remain the only way into fbgemm's int8 GEMM
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch._make_per_channel_quantized_tensor(
                q, scale.reshape(-1).double(), torch.zeros(q.shape[0], dtype=torch.long), 0
            )
            fbgemm = torch.ops.quantized.linear_prepack(qweight, None)
    except (AttributeError, NotImplementedError, RuntimeError):
        return None
    return Int8Weight(fbgemm, q.t().contiguous(), scale.reshape(-1).contiguous())


def linear_int8(x: Tensor, weight: Int8Weight) -> Tensor:
    """`x @ W.T` on the stored integers, accumulated in int32 and rescaled to fp32.

    The activations are quantized on the fly, and how matters more than the weights: one scale for a
    whole [rows, in] activation (fbgemm's `linear_dynamic`, 7-bit because AVX2's 8-bit multiply-add
    saturates) let one outlier row coarsen all the others, and put dfim-small's top-1 agreement with bf16
    on a 32-row canvas at ~90%. So several rows get a scale each (8-bit, symmetric) and go through
    `torch._int_mm` (oneDNN), about as fast from 16 rows up; one row (a drafted token) is its own
    tensor, and fbgemm's fused kernel is ~2x faster there than the six ops of the per-row route."""
    rows = x.numel() // x.shape[-1]
    if rows == 1:
        return torch.ops.quantized.linear_dynamic(x, weight.fbgemm, True)
    flat = x.reshape(rows, x.shape[-1])
    x_scale = flat.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-30).div_(QMAX)
    xq = torch.round(flat / x_scale).to(torch.int8)
    out = torch._int_mm(xq, weight.transposed).float().mul_(x_scale).mul_(weight.scale)
    return out.view(*x.shape[:-1], -1)


# `DFIM_INT8_PRODUCTS` spellings; anything else is "auto" (the probe), with a warning.
_ON, _OFF = ("on", "1", "true", "yes"), ("off", "0", "false", "no")
# The int8 route must beat the fallback by this much: where the two are close, the choice (whose outputs
# differ slightly) should not flip between restarts with the load on the machine.
INT8_MARGIN = 0.75


@functools.cache
def int8_products_fast() -> bool:
    """Whether `linear_int8` beats the products an int8 model otherwise runs (fbgemm's fp16 copy, as a 16-bit
    model's, or fp32) on this machine by `INT8_MARGIN`, timed once per process on a canvas-sized product:
    32 rows x [512 -> 1024], the two interleaved and each the fastest of seven (the least disturbed by other
    work). A route that fails is not chosen. `DFIM_INT8_PRODUCTS=on|off` decides instead."""
    setting = os.environ.get("DFIM_INT8_PRODUCTS", "auto").strip().lower()
    if setting in _ON or setting in _OFF:
        return setting in _ON
    if setting not in ("", "auto"):
        log.warning("DFIM_INT8_PRODUCTS=%r is none of on, off, auto: timing the int8 products", setting)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 512, generator=g)
    q, scale = quantize_per_channel(torch.randn(1024, 512, generator=g))
    weight = q.float() * scale
    int8 = pack_int8(weight)
    if int8 is None:
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            fp16 = torch.ops.quantized.linear_prepack_fp16(weight, None)
    except (AttributeError, NotImplementedError, RuntimeError):
        fp16 = None
    routes = {"int8": lambda: linear_int8(x, int8), "fp32": lambda: torch.nn.functional.linear(x, weight)}
    if fp16 is not None:
        routes["fp16"] = lambda: torch.ops.quantized.linear_dynamic_fp16(x, fp16)
    best = dict.fromkeys(routes, float("inf"))
    with torch.no_grad():
        for round_ in range(8):  # round 0 warms up; the routes take turns, so load hits them alike
            for name, product in list(routes.items()):
                start = time.perf_counter()
                try:
                    product()
                except (RuntimeError, NotImplementedError) as exc:
                    log.warning("the %s products fail here (%s): not used", name, exc)
                    del routes[name], best[name]
                    continue
                if round_ > 0:
                    best[name] = min(best[name], time.perf_counter() - start)
    if "int8" not in best:
        return False
    other = min((t for name, t in best.items() if name != "int8"), default=float("inf"))
    fast = best["int8"] < INT8_MARGIN * other
    log.info(
        "int8 products %s: %.2f ms against %.2f ms for the fallback (32 x 512 -> 1024)",
        "used" if fast else "not used",
        best["int8"] * 1e3,
        other * 1e3,
    )
    return fast
