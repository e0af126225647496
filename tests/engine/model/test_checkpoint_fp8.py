"""Scaled FP8 checkpoints (fbgemm_fp8, compressed-tensors, transformers' fine-grained `fp8`) load and
dequantize to the model they were quantized from; broken ones fail with a one-line CheckpointError.

The FP8 folders are written here, independently of the loader, in the layouts those tools write:
float8_e4m3fn weights, float32 scales named `*.weight_scale` / `*.weight_scale_inv` (fused expert
tensors: `*.gate_up_proj_scale`), and `quantization_config` in config.json.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dfim.engine.api import CheckpointError
from dfim.engine.model import config as model_config
from dfim.engine.model import fp8
from dfim.engine.model.checkpoint import INDEX_FILE, load_model, write_random_checkpoint
from dfim.engine.model.fp8 import dequantize, scale_layout
from dfim.engine.model.kv_cache import KVCache
from dfim.engine.model.tokenizer import Tokenizer

TOKENIZER = Path(__file__).resolve().parents[3] / "engine" / "weights" / "dfim-small" / "tokenizer.json"
FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
# e4m3 keeps 3 mantissa bits: rounding is off by at most 2^-4 of the value, plus half the smallest
# subnormal (2^-10 of the scale) near zero.
REL_ERR, SUBNORMAL_ERR = 2.0**-4, 2.0**-10

# The quantization_config each tool writes (values as transformers' FineGrainedFP8Config /
# FbgemmFp8Config.to_dict() and llm-compressor's FP8 schemes give them).
FBGEMM = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": None}


def fine_grained(block: list[int]) -> dict:
    return {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": block,
        "modules_to_not_convert": None,
        "dequantize": False,
        "scale_fmt": "float",
    }


def compressed_tensors(strategy: str, block: list[int] | None = None) -> dict:
    scheme = {
        "num_bits": 8,
        "type": "float",
        "symmetric": True,
        "strategy": strategy,
        "group_size": None,
        "block_structure": block,
        "dynamic": False,
        "actorder": None,
        "observer": "minmax",
        "observer_kwargs": {},
    }
    activations = dict(scheme, strategy="token", dynamic=True, block_structure=None, observer=None)
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": scheme, "input_activations": activations}
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "global_compression_ratio": None,
    }


# --- writing FP8 folders ------------------------------------------------------------------------------


def is_quantized(key: str, tensor: torch.Tensor) -> bool:
    """Linear and expert weights, as FP8 tools pick them; embeddings, norms and the router stay."""
    return tensor.ndim in (2, 3) and key.endswith(("_proj.weight", "_proj")) and "router" not in key


def quantize(
    weight: torch.Tensor, layout: str, block: tuple[int, int] | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (float8 weight q, float32 scale in the given layout, the weight q * scale stands for)."""
    w = weight.float()
    if layout == "tensor":
        scale = w.abs().amax().clamp(min=1e-12) / FP8_MAX
        full = scale
    elif layout in ("channel", "channel_1d"):
        scale = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / FP8_MAX  # [.., out, 1]
        full = scale
        if layout == "channel_1d":
            scale = scale.squeeze(-1)  # [out] (or [E, out])
    else:  # block: amax over each bm x bn tile, the last tiles cut short when they do not divide
        assert block is not None
        bm, bn = block
        rows, cols = w.shape[-2:]
        grid = (math.ceil(rows / bm), math.ceil(cols / bn))
        padded = torch.zeros(*w.shape[:-2], grid[0] * bm, grid[1] * bn)
        padded[..., :rows, :cols] = w.abs()
        tiles = padded.reshape(*w.shape[:-2], grid[0], bm, grid[1], bn)
        scale = tiles.amax(dim=(-3, -1)).clamp(min=1e-12) / FP8_MAX  # [.., grid0, grid1]
        full = scale.repeat_interleave(bm, dim=-2).repeat_interleave(bn, dim=-1)[..., :rows, :cols]
    q = (w / full).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale.to(torch.float32), q.float() * full


def write_fp8(
    base: Path,
    out: Path,
    quantization_config: dict,
    layout: str,
    block: tuple[int, int] | None = None,
    scale_suffix: str = "_scale",
) -> tuple[Path, dict[str, torch.Tensor]]:
    """An FP8 copy of checkpoint `base`, in two shards with an index (as big checkpoints come), and
    the float32 weights it stands for (dequantized here, by the writer's own arithmetic)."""
    out.mkdir(parents=True)
    for name in ("generation_config.json", "tokenizer.json", "dfim.json"):
        shutil.copyfile(base / name, out / name)
    tensors: dict[str, torch.Tensor] = {}
    meant: dict[str, torch.Tensor] = {}
    for shard in sorted(base.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():
                value = f.get_tensor(key)
                if not is_quantized(key, value):
                    tensors[key] = value.to(torch.bfloat16)
                    meant[key] = tensors[key].float()
                    continue
                q, scale, meant[key] = quantize(value, layout, block)
                tensors[key] = q
                stem = key.removesuffix(".weight")
                tensors[f"{stem}.weight{scale_suffix}" if stem != key else f"{key}{scale_suffix}"] = scale
    keys = sorted(tensors)
    half = len(keys) // 2
    weight_map = {}
    for i, part in enumerate((keys[:half], keys[half:]), start=1):
        name = f"model-{i:05d}-of-00002.safetensors"
        save_file({k: tensors[k].contiguous() for k in part}, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    (out / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = quantization_config
    config["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out, meant


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A random tiny checkpoint for the exact checks: cheap, with both dense and expert weights."""
    return write_random_checkpoint(tmp_path_factory.mktemp("random"), TOKENIZER, seed=3)


def logits(model, ids: list[int]) -> torch.Tensor:
    """Decoder logits for the 32 tokens after a 300-token context (the canvas holds the true text)."""
    cache = KVCache(model.config.num_hidden_layers)
    with torch.no_grad():
        model.encode(torch.tensor([ids[:300]]), cache)
        return model.denoise(torch.tensor([ids[300:332]]), cache).float()


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# --- loading ------------------------------------------------------------------------------------------

CASES = {
    "fbgemm per-channel [out,1]": (FBGEMM, "channel", None, "_scale"),
    "compressed-tensors per-channel [out]": (compressed_tensors("channel"), "channel_1d", None, "_scale"),
    "compressed-tensors per-tensor": (compressed_tensors("tensor"), "tensor", None, "_scale"),
    "compressed-tensors block 32x32": (compressed_tensors("block", [32, 32]), "block", (32, 32), "_scale"),
    # 64 and 128 are not multiples of 24: the scale grid rounds up and the last blocks are narrower.
    "fine-grained fp8 block 16x24": (fine_grained([16, 24]), "block", (16, 24), "_scale_inv"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fp8_checkpoint_dequantizes_to_the_model_it_came_from(tmp_path, base, case):
    config, layout, block, suffix = CASES[case]
    folder, meant = write_fp8(base, tmp_path / "fp8", config, layout, block, suffix)
    reference, _ = load_model(base, dtype=torch.float32)
    loaded, _ = load_model(folder, dtype=torch.float32)
    ref_state, got_state = reference.state_dict(), loaded.state_dict()

    quantized = 0
    for key, want in ref_state.items():
        got = got_state[key]
        assert got.dtype == torch.float32 and got.shape == want.shape, key
        # Exactly the weights the writer meant (its own q * scale), expert tensors included.
        torch.testing.assert_close(got, meant[key], rtol=1e-6, atol=0, msg=key)
        if is_quantized(key, want):
            quantized += 1
            # And within FP8 rounding of the original: a scale broadcast along the wrong axis, or a
            # block grid read off by one, would be off by far more.
            bound = REL_ERR * want.abs() + SUBNORMAL_ERR * want.abs().amax() + 1e-7
            assert bool(((got - want).abs() <= bound).all()), key
            assert not torch.equal(got, want), key  # it really went through FP8
    assert quantized >= 10


@pytest.fixture(scope="module")
def shipped() -> tuple[Path, list[int]]:
    """The shipped trained model and 332 tokens of real code: a random model's logits are too
    sensitive (2 % weight noise moves them 18 %) to show what FP8 does to a real one."""
    folder = Path(__file__).resolve().parents[3] / "engine" / "weights" / "dfim-small"
    ids = Tokenizer.from_file(folder / "tokenizer.json").encode(Path(model_config.__file__).read_text())
    assert len(ids) >= 332
    return folder, ids


@pytest.mark.parametrize("case", ["fbgemm per-channel [out,1]", "fine-grained fp8 block 16x24"])
def test_fp8_logits_stay_close_to_the_bf16_model(tmp_path, shipped, case):
    folder, ids = shipped
    config, layout, block, suffix = CASES[case]
    fp8_folder, _ = write_fp8(folder, tmp_path / "fp8", config, layout, block, suffix)
    bf16, _ = load_model(folder, dtype=torch.bfloat16)
    fp8, _ = load_model(fp8_folder, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in fp8.parameters())
    want, got = logits(bf16, ids), logits(fp8, ids)
    # Measured: 1.5-3.6 % relative error and every argmax kept (bf16 vs fp32 alone: 0.6 %).
    assert relative_error(got, want) < 0.08
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


def test_fused_expert_tensors_take_per_expert_scales(tmp_path, base):
    folder, meant = write_fp8(base, tmp_path / "fp8", FBGEMM, "channel")
    names: set[str] = set()
    for shard in folder.glob("model-*.safetensors"):
        with safe_open(str(shard), framework="pt") as f:
            names |= set(f.keys())
    key = "model.decoder.layers.0.experts.gate_up_proj"
    assert f"{key}_scale" in names  # [E, out, 1] next to the [E, out, in] FP8 tensor
    loaded, _ = load_model(folder)
    torch.testing.assert_close(loaded.state_dict()[key], meant[key], rtol=1e-6, atol=0)


# --- the dequantizer on its own --------------------------------------------------------------------


def test_dequantize_layouts_by_hand():
    q = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]).to(FP8)  # exact in e4m3
    w = q.float()
    torch.testing.assert_close(dequantize(q, torch.tensor(2.0), torch.float32), w * 2)
    per_row = torch.tensor([[10.0], [100.0]])
    torch.testing.assert_close(dequantize(q, per_row, torch.float32), w * per_row)
    torch.testing.assert_close(dequantize(q, per_row.squeeze(1), torch.float32), w * per_row)
    # Blocks of 1 x 2 over 3 columns: the grid rounds up to 2 columns, the last block is 1 wide.
    blocks = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    want = w * torch.tensor([[1.0, 1.0, 3.0], [5.0, 5.0, 7.0]])
    torch.testing.assert_close(dequantize(q, blocks, torch.float32, [(1, 2)]), want)
    # ue8m0 scales (powers of two as biased exponent bytes): 128 -> 2, 126 -> 0.5.
    torch.testing.assert_close(
        dequantize(q, torch.tensor([[128], [126]], dtype=torch.uint8), torch.float32),
        w * torch.tensor([[2.0], [0.5]]),
    )


def test_dequantize_in_chunks_equals_one_pass(monkeypatch):
    # A 26B checkpoint's expert tensors are dequantized a slab of rows at a time; the slabs must meet.
    gen = torch.Generator().manual_seed(0)
    q = (torch.randn(3, 40, 56, generator=gen) * 100).to(FP8)
    for scale, blocks in [
        (torch.rand(3, 40, 1, generator=gen), []),
        (torch.rand(3, 3, 4, generator=gen), [(16, 16)]),
    ]:
        whole = dequantize(q, scale, torch.float32, blocks)
        monkeypatch.setattr(fp8, "CHUNK_ELEMENTS", 100)  # 1 row of 56 at a time
        torch.testing.assert_close(dequantize(q, scale, torch.float32, blocks), whole, rtol=0, atol=0)
        monkeypatch.undo()
    want = q.float() * scale.repeat_interleave(16, 1).repeat_interleave(16, 2)[:, :40, :56]
    torch.testing.assert_close(whole, want)


def test_scale_layout_refuses_shapes_that_fit_nothing():
    assert scale_layout((64, 128), (64, 1)) == ((1, 64, 1), None)
    assert scale_layout((4, 64, 128), (4, 2, 1), [(32, 128)]) == ((4, 2, 1), (32, 128))
    assert scale_layout((64, 128), (2, 4)) == ((1, 2, 4), (32, 32))  # undeclared blocks that divide
    for bad in [(65, 1), (1, 60), (3, 5), (2, 64, 1)]:
        with pytest.raises(ValueError, match="scale of shape"):
            scale_layout((64, 128), bad)
    with pytest.raises(ValueError, match="config block sizes"):  # declared blocks must be the ones
        scale_layout((64, 128), (2, 4), [(16, 16)])


# --- broken folders ---------------------------------------------------------------------------------


@pytest.fixture
def fp8_folder(tmp_path, base) -> Path:
    return write_fp8(base, tmp_path / "fp8", FBGEMM, "channel")[0]


def edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def edit_tensors(folder: Path, fn) -> None:
    """Rewrite every shard through fn(dict of tensors), keeping the index in step."""
    index = json.loads((folder / INDEX_FILE).read_text())
    for shard in sorted(folder.glob("model-*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        fn(tensors)
        save_file(tensors, str(shard))
        for key in list(index["weight_map"]):
            if index["weight_map"][key] == shard.name and key not in tensors:
                del index["weight_map"][key]
        index["weight_map"].update(dict.fromkeys(tensors, shard.name))
    (folder / INDEX_FILE).write_text(json.dumps(index))


def load_error(folder: Path) -> str:
    with pytest.raises(CheckpointError) as info:
        load_model(folder)
    message = str(info.value)
    assert "\n" not in message and str(folder) in message
    return message


UP = "model.decoder.layers.0.mlp.up_proj"


def test_unknown_quantization_methods_are_refused(fp8_folder):
    edit_config(fp8_folder, quantization_config={"quant_method": "awq", "bits": 4})
    assert "quant_method 'awq' is not supported" in load_error(fp8_folder)
    int8 = compressed_tensors("channel")
    int8["config_groups"]["group_0"]["weights"].update(type="int", num_bits=8)
    int8["format"] = "int-quantized"
    edit_config(fp8_folder, quantization_config=int8)
    assert "format 'int-quantized' is not supported" in load_error(fp8_folder)
    int8["format"] = "naive-quantized"
    edit_config(fp8_folder, quantization_config=int8)
    assert "8-bit int" in load_error(fp8_folder)
    edit_config(fp8_folder, quantization_config={"quant_method": "modelopt", "quant_algo": "NVFP4"})
    assert "'NVFP4' is not supported" in load_error(fp8_folder)


def test_a_scale_without_its_weight_is_refused(fp8_folder):
    edit_tensors(fp8_folder, lambda t: t.pop(f"{UP}.weight", None))
    assert f"scale key {UP}.weight_scale has no weight {UP}.weight" in load_error(fp8_folder)


def test_a_scale_of_no_weight_of_the_model_is_refused(fp8_folder):
    def add(tensors):
        if f"{UP}.weight" in tensors:
            tensors["model.decoder.layers.0.mlp.side_proj.weight_scale"] = torch.ones(1)

    edit_tensors(fp8_folder, add)
    assert "side_proj.weight_scale belongs to no weight" in load_error(fp8_folder)


def test_misshaped_scales_and_weights_are_refused(fp8_folder):
    def bad_scale(tensors):
        if f"{UP}.weight_scale" in tensors:
            tensors[f"{UP}.weight_scale"] = torch.ones(tensors[f"{UP}.weight"].shape[0] + 1, 1)

    edit_tensors(fp8_folder, bad_scale)
    message = load_error(fp8_folder)
    assert f"{UP}.weight_scale" in message and "neither per-tensor, per-channel nor per-block" in message

    def bad_weight(tensors):
        if f"{UP}.weight" in tensors:
            tensors[f"{UP}.weight"] = tensors[f"{UP}.weight"][:, :-1].contiguous()

    edit_tensors(fp8_folder, bad_weight)
    assert f"{UP}.weight has shape" in load_error(fp8_folder)


def test_block_scales_must_match_the_declared_grid(tmp_path, base):
    folder, _ = write_fp8(base, tmp_path / "fp8", fine_grained([16, 24]), "block", (16, 24), "_scale_inv")

    def drop_a_column(tensors):
        key = f"{UP}.weight_scale_inv"
        if key in tensors:
            tensors[key] = tensors[key][:, :-1].contiguous()

    edit_tensors(folder, drop_a_column)
    message = load_error(folder)
    assert f"{UP}.weight_scale_inv" in message and "config block sizes [[16, 24]]" in message


def test_other_architectures_are_refused(fp8_folder):
    edit_config(fp8_folder, model_type="llama", architectures=["LlamaForCausalLM"])
    assert "not a DiffusionGemma checkpoint" in load_error(fp8_folder)


def test_scales_need_a_quantization_config_and_fp8_weights_need_scales(fp8_folder):
    config = json.loads((fp8_folder / "config.json").read_text())
    del config["quantization_config"]
    (fp8_folder / "config.json").write_text(json.dumps(config))
    assert "no quantization_config" in load_error(fp8_folder)

    edit_config(fp8_folder, quantization_config=FBGEMM)
    edit_tensors(fp8_folder, lambda t: t.pop(f"{UP}.weight_scale", None))
    assert f"{UP}.weight is torch.float8_e4m3fn but has no weight_scale" in load_error(fp8_folder)


def test_activation_and_kv_scales_are_not_needed(fp8_folder):
    def add(tensors):
        if f"{UP}.weight" in tensors:
            tensors[f"{UP}.input_scale"] = torch.ones(1)
            tensors["model.decoder.layers.0.self_attn.k_scale"] = torch.ones(1)

    edit_tensors(fp8_folder, add)
    load_model(fp8_folder)


# --- experts kept in FP8 (`load_model(fp8_experts=True)`, what a GPU does) ----------------------------


@pytest.mark.parametrize(
    "case", ["fbgemm per-channel [out,1]", "compressed-tensors per-tensor", "fine-grained fp8 block 16x24"]
)
def test_experts_can_stay_fp8_and_compute_what_the_dequantized_ones_do(tmp_path, base, case):
    from dfim.engine.model.experts import Experts

    config, layout, block, suffix = CASES[case]
    folder, _ = write_fp8(base, tmp_path / "fp8", config, layout, block, suffix)
    dequantized, _ = load_model(folder)
    kept, _ = load_model(folder, fp8_experts=True)
    experts = [m for m in kept.modules() if isinstance(m, Experts)]
    assert experts
    for m in experts:  # FP8 weights, an FP8 kernel (the CPU's: widened per expert), no bf16 copy
        assert m.fp8 is not None and m.fp8.gate_up.dtype == FP8 and m.mode == "w8a16_reference"
        assert m.gate_up_proj.numel() == 0 and m.down_proj.numel() == 0
    key = "model.decoder.layers.0.experts.gate_up_proj"
    stored = None
    for shard in folder.glob("model-*.safetensors"):
        with safe_open(str(shard), framework="pt") as f:
            if key in f.keys():
                stored = f.get_tensor(key)
    assert stored is not None
    fp8_experts = [m for name, m in kept.named_modules() if name == key.removesuffix(".gate_up_proj")][0].fp8
    if layout != "block":  # per tensor and per channel: the checkpoint's bytes, as stored
        assert torch.equal(fp8_experts.gate_up.view(torch.uint8), stored.view(torch.uint8))
    # the weights the kept tensors stand for: the checkpoint's, within one more e4m3 rounding for block scales
    from dfim.engine.model.experts_fp8 import dequantize_rows

    scale = [m for name, m in kept.named_modules() if name == key.removesuffix(".gate_up_proj")][0].fp8
    want_w = dequantized.state_dict()[key]
    got_w = dequantize_rows(scale.gate_up, scale.gate_up_scale)
    bound = (
        (REL_ERR * want_w.abs() + SUBNORMAL_ERR * want_w.abs().amax(dim=-1, keepdim=True))
        if layout == "block"
        else 1e-6
    )
    assert bool(((got_w - want_w).abs() <= bound + 1e-7).all())
    ids = list(range(5, 337))
    want, got = logits(dequantized, ids), logits(kept, ids)
    if layout == "block":  # block scales are quantized again per row: a second rounding of each weight,
        # which a random model amplifies (2 % weight noise moves its logits 18 %; measured here: 8.5 %)
        assert relative_error(got, want) < 0.15
    else:  # the same products of the same values
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_experts_left_unscaled_load_as_any_tensor(tmp_path, base):
    """A quantizer may leave a layer's experts in high precision: with fp8_experts those load widened, the
    scaled ones stay FP8."""
    from dfim.engine.model.experts import Experts

    folder, _ = write_fp8(base, tmp_path / "fp8", FBGEMM, "channel")
    unscaled = "model.decoder.layers.1.experts"

    def widen(tensors: dict) -> dict:  # a weight and its scale sit next to each other in the sorted shards
        for name in ("gate_up_proj", "down_proj"):
            weight, scale = f"{unscaled}.{name}", f"{unscaled}.{name}_scale"
            if weight in tensors and scale in tensors:
                tensors[weight] = (tensors[weight].float() * tensors.pop(scale)).to(torch.bfloat16)
        return tensors

    edit_tensors(folder, widen)
    kept, _ = load_model(folder, fp8_experts=True)
    by_name = dict(kept.named_modules())
    assert by_name["model.decoder.layers.0.experts"].fp8 is not None
    assert by_name[unscaled].fp8 is None and by_name[unscaled].gate_up_proj.numel() > 0
    assert any(isinstance(m, Experts) for m in by_name.values())


def test_a_model_with_experts_kept_in_fp8_is_not_saved(tmp_path, base):
    from dfim.engine.model.checkpoint import save_model

    folder, _ = write_fp8(base, tmp_path / "fp8", FBGEMM, "channel")
    kept, _ = load_model(folder, fp8_experts=True)
    with pytest.raises(ValueError, match="kept in FP8"):
        save_model(kept, tmp_path / "out")


def test_random_weights_can_keep_their_experts_in_fp8(tmp_path):
    from dfim.engine.model.experts import Experts

    plain = write_random_checkpoint(tmp_path / "plain", TOKENIZER, seed=4, stored=False)
    fp8_folder = write_random_checkpoint(
        tmp_path / "fp8", TOKENIZER, seed=4, stored=False, init_experts="fp8"
    )
    assert json.loads((fp8_folder / "dfim.json").read_text())["random_init"]["experts"] == "fp8"
    model, _ = load_model(fp8_folder, fp8_experts=True)
    reference, _ = load_model(plain)
    assert (
        load_model(fp8_folder)[0].decoder.layers[0].experts.fp8 is None
    )  # only where FP8 experts are asked for
    experts = [m for m in model.modules() if isinstance(m, Experts)]
    assert experts and all(m.fp8 is not None and m.gate_up_proj.numel() == 0 for m in experts)
    ids = list(range(5, 337))
    assert relative_error(logits(model, ids), logits(reference, ids)) < 0.1
