"""Checkpoint folders in the HF format: `config.json`, `generation_config.json`, safetensors shards
(with `model.safetensors.index.json` when sharded), `tokenizer.json`, and our own `dfim.json` notes.

Weights are read only from safetensors (memory-mapped, tensor by tensor, no pickle); scaled FP8
checkpoints (`quantization_config` in config.json, `*_scale` keys) are dequantized on load by
engine/model/fp8.py, and so are our int8 ones (engine/model/int8.py), whose integers the CPU then multiplies
as they are. Every problem with a folder is a `CheckpointError` whose message names the path and
what is wrong.
"""

from __future__ import annotations

import json
import math
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer

from dfim.engine.api import CheckpointError, SamplerSettings, parse_draft_from, parse_rank
from dfim.engine.model import experts_fp8
from dfim.engine.model.config import ModelConfig
from dfim.engine.model.fp8 import (
    Quantization,
    QuantizationError,
    dequantize,
    is_float8,
    is_unused_aux,
    looks_like_scale,
    parse_quantization,
    scale_keys,
    scale_layout,
)
from dfim.engine.model.int8 import INT8_METHOD
from dfim.engine.model.network import DiffusionGemma
from dfim.engine.model.random_init import RANDOM_INIT, RandomInit, parse_random_init, random_model
from dfim.engine.model.shipped import (  # noqa: F401 - the shipped models' names live there, torch-free
    DEFAULT_MODEL_DIR,
    WEIGHTS_DIR,
    folder_not_found,
    resolve_checkpoint,
    shipped_models,
)

MAX_SHARD_BYTES = 16 * 2**20  # safetensors files stay under GitHub's and PyPI's comfortable sizes


INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
INFO_FILE = "dfim.json"
TRANSFORMERS_VERSION = "5.17.0"  # the reference release our files are checked against

# Checkpoint keys our text-only network does not use: the vision tower, and copies of tied weights.
IGNORED_PREFIXES = ("model.encoder.vision_tower.", "model.encoder.embed_vision.", "lm_head.")


def _is_ignored(key: str) -> bool:
    if key.startswith(IGNORED_PREFIXES):
        return True
    # Tied encoder weights, if a writer stored them: everything of the encoder but its layer scalars.
    return key.startswith("model.encoder.language_model.") and not key.endswith(".layer_scalar")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return value


def read_config(folder: Path) -> ModelConfig:
    path = folder / "config.json"
    raw = _read_json(path)
    archs = raw.get("architectures") or []
    if raw.get("model_type") != "diffusion_gemma" and "DiffusionGemmaForBlockDiffusion" not in archs:
        found = raw.get("model_type") or archs or "unknown"
        raise CheckpointError(f"{path}: not a DiffusionGemma checkpoint (model_type {found!r})")
    try:
        return ModelConfig.from_hf(raw)
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: unsupported or incomplete config ({err})") from None


def read_settings(folder: Path) -> SamplerSettings:
    """Sampler defaults from `generation_config.json`, then dfim's own knobs from `dfim.json`'s "sampler"
    (those the released format has no field for, e.g. {"window": 8}); absent ones keep the defaults."""
    settings = _read_generation_settings(folder)
    extra = read_info(folder).get("sampler") or {}
    if not isinstance(extra, dict):
        raise CheckpointError(f'{folder / INFO_FILE}: bad sampler setting ("sampler" is not an object)')
    # keys a later dfim may add are ignored here, not refused
    known = {"window": int, "rank": parse_rank, "draft": _bool, "draft_from": parse_draft_from}
    try:
        changes = {k: known[k](v) for k, v in extra.items() if k in known}
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{folder / INFO_FILE}: bad sampler setting ({err})") from None
    return replace(settings, **changes)


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _read_generation_settings(folder: Path) -> SamplerSettings:
    path = folder / "generation_config.json"
    if not path.exists():
        return SamplerSettings()
    raw = _read_json(path)
    defaults = SamplerSettings()
    sampler = raw.get("sampler_config") or {}
    if not isinstance(sampler, dict):
        raise CheckpointError(f"{path}: bad sampler_config (expected a JSON object, got {sampler!r})")

    def pick(section: dict[str, Any], key: str, default: Any, minimum: float | None = None) -> Any:
        """The value of `key` as the default's type; CheckpointError naming the file and key when it is not
        one (a fill would otherwise die with a bare ValueError, or a sampler error naming no file)."""
        value = section.get(key)
        if value is None:
            return default
        # A number, or a string of one; not a bool (True would read as 1 step) nor a list.
        ok = isinstance(value, int | float | str) and not isinstance(value, bool)
        try:
            number = type(default)(value) if ok else None
        except (TypeError, ValueError, OverflowError):  # "abc"; "inf" for an int field
            number = None
        if number is not None and math.isfinite(number) and (minimum is None or number >= minimum):
            return number
        kind = "an integer" if isinstance(default, int) else "a number"
        least = f" of at least {minimum}" if minimum is not None else ""
        raise CheckpointError(f"{path}: bad {key} (expected {kind}{least}, got {value!r})")

    return SamplerSettings(
        max_steps=pick(raw, "max_denoising_steps", defaults.max_steps, minimum=1),
        entropy_bound=pick(sampler, "entropy_bound", defaults.entropy_bound),
        t_max=pick(raw, "t_max", defaults.t_max),
        t_min=pick(raw, "t_min", defaults.t_min),
        stability_threshold=pick(raw, "stability_threshold", defaults.stability_threshold),
        confidence_threshold=pick(raw, "confidence_threshold", defaults.confidence_threshold),
    )


def read_info(folder: Path) -> dict[str, Any]:
    """Our notes on a checkpoint (name, whether it is an untrained random one, training summary)."""
    path = Path(folder) / INFO_FILE
    return _read_json(path) if path.exists() else {}


def _shard_files(folder: Path) -> dict[str, list[str]]:
    """Shard file name -> the keys it holds, according to the index (or the single file)."""
    index_path = folder / INDEX_FILE
    if index_path.exists():
        weight_map = _read_json(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index_path}: no weight_map")
        files: dict[str, list[str]] = {}
        for key, name in weight_map.items():
            files.setdefault(name, []).append(key)
        return files
    if (folder / SINGLE_FILE).exists():
        return {SINGLE_FILE: []}  # keys read from the file itself
    raise CheckpointError(
        f"{folder}: no weights ({INDEX_FILE} or {SINGLE_FILE}), and its {INFO_FILE} does not ask for "
        f'random ones ("{RANDOM_INIT}", engine/model/random_init.py)'
    )


def _stored_weights(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("model*.safetensors")) + (
        [INDEX_FILE] if (folder / INDEX_FILE).exists() else []
    )


def _open_shards(folder: Path, stack: ExitStack) -> dict[str, Any]:
    """Key -> the open (memory-mapped) shard holding it. Nothing is read yet but the headers."""
    handles: dict[str, Any] = {}
    for name in _shard_files(folder):
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path}: shard listed in the index is missing")
        try:
            shard = stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            keys = list(shard.keys())
        except Exception as err:  # safetensors raises several types for truncated/corrupt files
            raise CheckpointError(f"{path}: corrupt safetensors file ({err})") from None
        for key in keys:
            if not _is_ignored(key):
                handles[key] = (path, shard)
    return handles


def _read_quantization(folder: Path) -> Quantization | None:
    path = folder / "config.json"
    try:
        return parse_quantization(_read_json(path))
    except QuantizationError as err:
        raise CheckpointError(f"{path}: {err}") from None


def _match_scales(folder: Path, expected: dict[str, torch.Tensor], present: set[str]) -> dict[str, str]:
    """Weight key -> its scale key, for every scale in the checkpoint; refuses scales without weights."""
    scales: dict[str, str] = {}
    for key in expected:
        found = [name for name in scale_keys(key) if name in present and name not in expected]
        if len(found) > 1:
            raise CheckpointError(f"{folder}: {key} has two scales ({found[0]} and {found[1]})")
        if found:
            if key not in present:
                raise CheckpointError(f"{folder}: scale key {found[0]} has no weight {key} beside it")
            scales[key] = found[0]
    used = set(scales.values())
    for name in sorted(present - set(expected) - used):
        if looks_like_scale(name) and not is_unused_aux(name):
            raise CheckpointError(f"{folder}: scale key {name} belongs to no weight of this model")
    return scales


def load_model(
    folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32, *, fp8_experts: bool = False
) -> tuple[DiffusionGemma, SamplerSettings]:
    """Build the network from a checkpoint folder, checking every key and shape against the config.

    Tensors are read one at a time from the memory-mapped shards and moved to `device` in `dtype`, so
    host memory holds one tensor, not the checkpoint. Scaled FP8 weights (see engine/model/fp8.py) are
    dequantized on `device` as they are read, except, with `fp8_experts`, the experts' weights, which stay
    FP8 and run on the FP8 kernels (`experts_fp8.row_scaled`: half the bytes a pass reads). A folder whose
    dfim.json has a `random_init` entry holds no weights: they are made on `device`
    (engine/model/random_init.py)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise folder_not_found(folder)
    config = read_config(folder)
    quant = _read_quantization(folder)
    settings = read_settings(folder)
    init = parse_random_init(read_info(folder), folder / INFO_FILE)
    if init is not None:
        stored = _stored_weights(folder)
        if stored:  # which of the two was meant is not ours to guess
            raise CheckpointError(f"{folder}: {INFO_FILE} asks for random weights, but it holds {stored[0]}")
        model = random_model(config, init, device, dtype)
        if init.experts == "fp8" and fp8_experts:
            experts_fp8.keep_experts_in_fp8(model, torch.device(device), dtype)
        return model, settings
    with torch.device("meta"):
        model = DiffusionGemma(config)
    expected = model.state_dict()
    with ExitStack() as stack:
        handles = _open_shards(folder, stack)
        present = set(handles)
        scales = _match_scales(folder, expected, present)
        if scales and quant is None:
            example = next(iter(scales.values()))
            raise CheckpointError(
                f"{folder}: weights carry scales (e.g. {example}) but config.json has no quantization_config"
            )
        missing = sorted(set(expected) - present)
        unexpected = sorted(
            present - set(expected) - set(scales.values()) - {k for k in present if is_unused_aux(k)}
        )
        if missing:
            raise CheckpointError(f"{folder}: {len(missing)} weights missing, e.g. {missing[:3]}")
        if unexpected:
            raise CheckpointError(f"{folder}: {len(unexpected)} unknown weights, e.g. {unexpected[:3]}")
        # Check every shape from the headers before reading any data: a wrong 50 GB folder fails at once.
        for key, want in expected.items():
            shape = _shape(handles, key)
            if shape != tuple(want.shape):
                raise CheckpointError(
                    f"{folder}: {key} has shape {shape}, config.json implies {tuple(want.shape)}"
                )
            if key in scales:
                try:
                    scale_layout(shape, _shape(handles, scales[key]), quant.blocks if quant else ())
                except QuantizationError as err:
                    raise CheckpointError(f"{folder}: {scales[key]}: {err}") from None
        fp8 = fp8_experts and quant is not None and quant.method != INT8_METHOD
        pairs = experts_fp8.scaled_expert_pairs(scales) if fp8 else {}
        kept = {key for pair in pairs.values() for key in pair}
        state = {
            key: _load_tensor(folder, handles, key, scales.get(key), quant, device, dtype)
            for key in expected
            if key not in kept
        }
        model.load_state_dict(state, strict=not kept, assign=True)
        if pairs:
            assert quant is not None

            def read(key: str) -> tuple[torch.Tensor, torch.Tensor]:
                weight = _get(handles, key)
                if not is_float8(weight.dtype):
                    raise CheckpointError(
                        f"{folder}: {key} has a scale ({scales[key]}) but is {weight.dtype}"
                    )
                return weight.to(device), _get(handles, scales[key]).to(device)

            try:
                experts_fp8.keep_experts_in_fp8(model, torch.device(device), dtype, pairs, read, quant.blocks)
            except QuantizationError as err:
                raise CheckpointError(f"{folder}: {err}") from None
    model.int8_weights = quant is not None and quant.method == INT8_METHOD
    model.eval()
    return model, settings


def _shape(handles: dict[str, Any], key: str) -> tuple[int, ...]:
    return tuple(handles[key][1].get_slice(key).get_shape())


def _get(handles: dict[str, Any], key: str) -> torch.Tensor:
    path, shard = handles[key]
    try:
        return shard.get_tensor(key)
    except Exception as err:  # a header that promises more bytes than a truncated file holds
        raise CheckpointError(f"{path}: cannot read {key} ({err})") from None


def _load_tensor(
    folder: Path,
    handles: dict[str, Any],
    key: str,
    scale_key: str | None,
    quant: Quantization | None,
    device: str,
    dtype: torch.dtype,
) -> torch.Tensor:
    tensor = _get(handles, key)
    int8 = quant is not None and quant.method == INT8_METHOD
    quantized_dtype = torch.int8 if int8 else None  # None: any float8
    if not tensor.is_floating_point() and not (int8 and tensor.dtype == torch.int8):
        raise CheckpointError(f"{folder}: {key} is {tensor.dtype}, not a floating-point tensor")
    if scale_key is None:
        if quant is not None and (is_float8(tensor.dtype) or tensor.dtype == torch.int8):
            # In a quantized checkpoint an unscaled FP8 or int8 tensor is a broken file, not "scale 1".
            raise CheckpointError(f"{folder}: {key} is {tensor.dtype} but has no weight_scale")
        return tensor.to(device=device, dtype=dtype)
    if quantized_dtype is not None and tensor.dtype != quantized_dtype:
        raise CheckpointError(
            f"{folder}: {key} has a scale ({scale_key}) but is {tensor.dtype}, not int8 ({INT8_METHOD})"
        )
    if quantized_dtype is None and not is_float8(tensor.dtype):
        raise CheckpointError(f"{folder}: {key} has a scale ({scale_key}) but is {tensor.dtype}, not float8")
    assert quant is not None  # _match_scales' caller refused scales without a quantization_config
    scale = _get(handles, scale_key)
    try:
        # On the target device: the FP8 bytes travel (half of bf16), the multiply runs on the GPU.
        return dequantize(tensor.to(device), scale.to(device), dtype, quant.blocks)
    except QuantizationError as err:
        raise CheckpointError(f"{folder}: {scale_key}: {err}") from None


def save_model(
    model: DiffusionGemma,
    folder: str | Path,
    settings: SamplerSettings | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    dtype: torch.dtype = torch.bfloat16,
    info: dict[str, Any] | None = None,
) -> Path:
    """Write config, generation config and safetensors shards of at most `max_shard_bytes` each. A model whose
    experts were kept in FP8 (`load_model(fp8_experts=True)`) has no bf16 expert tensors to write: refused."""
    if experts_fp8.kept_in_fp8(model):
        raise ValueError(
            "this model's experts were kept in FP8 at load: load it without fp8_experts to save it"
        )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    settings = settings or SamplerSettings()
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    write_shards(state, folder, max_shard_bytes)
    return _write_notes(model.config, folder, settings, dtype, info)


def _write_notes(
    config: ModelConfig, folder: Path, settings: SamplerSettings, dtype: torch.dtype, info: dict | None
) -> Path:
    """config.json, generation_config.json and dfim.json: everything of a checkpoint but its weights."""
    dtype_name = str(dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(config.to_hf(dtype_name), indent=2) + "\n")
    (folder / "generation_config.json").write_text(
        json.dumps(generation_config(config, settings), indent=2) + "\n"
    )
    if info is not None:  # the notes' sampler entry always says what `settings` says
        info = {k: v for k, v in info.items() if k != "sampler"}
    # no field for these in the released format
    ours = {k: getattr(settings, k) for k in ("window", "rank", "draft", "draft_from")}
    ours = {k: v for k, v in ours.items() if v != getattr(SamplerSettings(), k)}
    if ours:  # kept in our own notes
        info = {**(info or {}), "sampler": ours}
    if info is not None:
        (folder / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return folder


def shard_plan(sizes: dict[str, int], max_shard_bytes: int = MAX_SHARD_BYTES) -> list[list[str]]:
    """The keys of each shard, from each tensor's bytes: sorted keys, a new shard when the next tensor would
    pass `max_shard_bytes` (a tensor larger than that gets a shard of its own)."""
    shards: list[list[str]] = [[]]
    size = 0
    for key in sorted(sizes):
        if shards[-1] and size + sizes[key] > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += sizes[key]
    return shards


def write_shards(state: dict[str, torch.Tensor], folder: Path, max_shard_bytes: int = MAX_SHARD_BYTES) -> int:
    """Write `state` as safetensors shards of at most `max_shard_bytes` each (`shard_plan`) plus the index,
    replacing any shards already in `folder`; returns the total bytes."""
    plan = shard_plan({key: t.numel() * t.element_size() for key, t in state.items()}, max_shard_bytes)
    shards = [{key: state[key] for key in keys} for keys in plan]

    for old in _stored_weights(folder):
        (folder / old).unlink(missing_ok=True)
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        weight_map.update({key: name for key in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return total


def generation_config(config: ModelConfig, settings: SamplerSettings) -> dict[str, Any]:
    """`generation_config.json` in the shape transformers' DiffusionGemmaGenerationConfig reads."""
    return {
        "max_new_tokens": config.canvas_length,
        "max_denoising_steps": settings.max_steps,
        "sampler_config": {"entropy_bound": settings.entropy_bound, "_cls_name": "EntropyBoundSamplerConfig"},
        "t_min": settings.t_min,
        "t_max": settings.t_max,
        "stability_threshold": settings.stability_threshold,
        "confidence_threshold": settings.confidence_threshold,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "transformers_version": TRANSFORMERS_VERSION,
    }


def write_random_checkpoint(
    folder: str | Path,
    tokenizer_json: str | Path,
    seed: int = 0,
    *,
    stored: bool = True,
    init_dtype: torch.dtype | None = None,
    init_experts: str | None = None,
    name: str = "random-tiny",
    **config_overrides: Any,
) -> Path:
    """A randomly initialised checkpoint (small unless `config_overrides` say otherwise) for tests, demos and
    benchmarks. `dfim.json` marks it untrained. `stored=False` writes no weights: `dfim.json`'s `random_init`
    has the loader make them on its device, in `init_dtype` (None: the dtype it is asked for), so a 26B shape
    costs no 52 GB of files (engine/model/random_init.py); `init_experts="fp8"` has it keep the experts in FP8."""
    tokenizer_json = Path(tokenizer_json)
    vocab_size = Tokenizer.from_file(str(tokenizer_json)).get_vocab_size()
    values: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "global_head_dim": 64,
        "num_global_key_value_heads": 1,
        "sliding_window": 64,
        "num_experts": 2,
        "top_k_experts": 1,
        "moe_intermediate_size": 64,
        "canvas_length": 64,
    }
    values.update(config_overrides)
    config = ModelConfig.from_dict(values)
    folder = Path(folder)
    info: dict[str, Any] = {"name": name, "random": True, "seed": seed}
    if stored:
        model = DiffusionGemma(config)
        model.init_weights(generator=torch.Generator().manual_seed(seed))
        save_model(model, folder, dtype=torch.float32, info=info)
    else:
        folder.mkdir(parents=True, exist_ok=True)
        for old in _stored_weights(folder):  # a folder written before with weights: they would be refused
            (folder / old).unlink()
        info[RANDOM_INIT] = RandomInit(seed=seed, dtype=init_dtype, experts=init_experts).to_json()
        _write_notes(config, folder, SamplerSettings(), init_dtype or torch.float32, info)
    (folder / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    return folder


def parameter_bytes(folder: str | Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors"))


def count_parameters(config: ModelConfig) -> int:
    with torch.device("meta"):
        return DiffusionGemma(config).num_parameters()
