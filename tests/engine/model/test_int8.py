"""The int8 checkpoint format and int8 CPU products (dfim.engine.model.int8): a converted dfim-small gives
the bf16 model's logits within a stated tolerance on real code, the format round-trips within the
quantization bound at half the bytes, and broken int8 folders are refused with a CheckpointError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dfim.engine.api import CheckpointError
from dfim.engine.model import network
from dfim.engine.model.checkpoint import (
    INDEX_FILE,
    WEIGHTS_DIR,
    load_model,
    parameter_bytes,
    write_random_checkpoint,
)
from dfim.engine.model.int8 import (
    INT8_METHOD,
    convert_checkpoint,
    int8_products_fast,
    pack_int8,
    quantize_per_channel,
)
from dfim.engine.model.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[3]
SMALL = WEIGHTS_DIR / "dfim-small"  # the bf16 checkpoint these tests convert
TOKENIZER = SMALL / "tokenizer.json"
# Real code the model never trained on as a file (our sampler as of 2026-11-27), frozen: the measured errors
# below belong to this text, and a live source file would change under them.
SOURCE = ROOT / "fixtures" / "int8" / "real_code.py.txt"

needs_int8_kernels = pytest.mark.skipif(
    torch.backends.quantized.engine not in ("x86", "fbgemm"), reason="no fbgemm int8 GEMM (not x86)"
)


@pytest.fixture(autouse=True)
def int8_products(monkeypatch: pytest.MonkeyPatch):
    """The int8 products on, whatever this machine's speed of them (`int8_products_fast`): these tests are
    about their numbers. `test_where_int8_products_are_slower_an_int8_model_runs_fp16_copies` turns them off."""
    monkeypatch.setenv("DFIM_INT8_PRODUCTS", "on")
    int8_products_fast.cache_clear()
    yield
    int8_products_fast.cache_clear()


@pytest.fixture(scope="module")
def small_int8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert_checkpoint(SMALL, tmp_path_factory.mktemp("int8") / "dfim-small-int8")


def canvas_logits(model: network.DiffusionGemma, context: list[int], canvas: list[int]) -> torch.Tensor:
    """Two denoising steps (the second self-conditioned on the first) after encoding `context`."""
    with torch.inference_mode():
        cache = model.new_cache()
        model.encode(torch.tensor([context]), cache)
        first = model.denoise(torch.tensor([canvas]), cache)
        second = model.denoise(torch.tensor([canvas]), cache, first)
    return torch.cat([first, second], dim=1)[0]


@needs_int8_kernels
def test_int8_logits_follow_the_bf16_model_on_real_code(small_int8: Path) -> None:
    reference, _ = load_model(SMALL)
    reference.prepare_cpu_inference()
    quantized, _ = load_model(small_int8)
    assert quantized.int8_weights and not reference.int8_weights
    quantized.prepare_cpu_inference()
    assert quantized.head_packed is not None and quantized.head_packed.kind == "int8"
    assert quantized.decoder.layers[0].experts.down_packed[0].kind == "int8"

    ids = Tokenizer.from_file(TOKENIZER).encode(SOURCE.read_text())
    errors, agree, confident, confident_agree = [], 0, 0, 0
    # three places in the file, 400 tokens of context each, a 32-token canvas: the true continuation with
    # every other token replaced by a random one (what a denoising step sees)
    for start in (0, 700, 1400):
        context = ids[start : start + 400]
        canvas = torch.tensor(ids[start + 400 : start + 432])
        noise = torch.randint(
            3, reference.config.vocab_size, (32,), generator=torch.Generator().manual_seed(start)
        )
        canvas[::2] = noise[::2]
        want = canvas_logits(reference, context, canvas.tolist())
        got = canvas_logits(quantized, context, canvas.tolist())
        errors.append((got - want).norm(dim=-1) / want.norm(dim=-1))
        same = got.argmax(-1) == want.argmax(-1)
        sure = want.softmax(-1).amax(-1) >= 0.5  # positions the sampler would accept
        agree += int(same.sum())
        confident += int(sure.sum())
        confident_agree += int((same & sure).sum())
    error = torch.cat(errors)
    # Measured (2 denoising steps x 32 rows x 3 contexts = 192 positions): relative L2 error of a position's
    # logits mean 0.022, worst 0.080; top-1 agreement 185/192 overall (bf16 weights dequantized from the same
    # int8, fp32 products: 188/192; the rest are near-ties on noise positions) and 122/122 where bf16 is sure.
    assert error.mean() < 0.04 and error.max() < 0.12, (
        f"relative logit error {error.mean():.3f} / {error.max():.3f}"
    )
    assert agree / len(error) >= 0.95, f"top-1 agreement {agree}/{len(error)}"
    assert confident >= 60 and confident_agree / confident >= 0.99, (
        f"{confident_agree}/{confident} sure positions"
    )

    # a drafted token runs one row per product (fbgemm's fused kernel): 16 of them after 400 tokens
    drafted = []
    for model in (reference, quantized):
        with torch.inference_mode():
            cache = model.new_cache()
            model.encode(torch.tensor([ids[:400]]), cache)
            rows = [model.context_lm(torch.tensor([[t]]), cache, last=1)[0, -1] for t in ids[400:416]]
        drafted.append(torch.stack(rows))
    want, got = drafted
    draft_error = ((got - want).norm(dim=-1) / want.norm(dim=-1)).mean().item()
    assert draft_error < 0.04, f"drafted tokens' relative logit error {draft_error:.3f}"  # measured 0.02
    assert (got.argmax(-1) == want.argmax(-1)).sum() >= 14


def test_round_trip_is_within_the_quantization_bound_at_half_the_bytes(small_int8: Path) -> None:
    reference, _ = load_model(SMALL)
    loaded, _ = load_model(small_int8)
    config = json.loads((small_int8 / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == INT8_METHOD
    assert (small_int8 / "generation_config.json").read_bytes() == (
        SMALL / "generation_config.json"
    ).read_bytes()
    # the tokenizer's JSON is written compact: the same value, the same ids, fewer bytes
    compact, indented = small_int8 / "tokenizer.json", SMALL / "tokenizer.json"
    assert json.loads(compact.read_text()) == json.loads(indented.read_text())
    assert compact.stat().st_size < 0.7 * indented.stat().st_size
    text = SOURCE.read_text()[:2000]
    assert Tokenizer.from_file(str(compact)).encode(text) == Tokenizer.from_file(str(indented)).encode(text)

    want, got = reference.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    matrices = 0
    for key, w in want.items():
        if w.ndim in (2, 3):
            matrices += 1
            # symmetric rounding: at most half a step, a step being max|row| / 127
            bound = w.abs().amax(-1, keepdim=True) / 127 / 2 * (1 + 1e-5) + 1e-12
            assert ((got[key] - w).abs() <= bound).all(), key
        else:
            assert torch.equal(got[key], w), key  # bf16 both ways: exact
    assert matrices > 8 * 5  # every layer's matrices and the embedding, not a few

    with safe_open(str(next(small_int8.glob("model-*.safetensors"))), framework="pt") as shard:
        assert shard.get_slice("model.decoder.embed_tokens.weight").get_dtype() == "I8"
        assert shard.get_slice("model.decoder.layers.0.experts.gate_up_proj").get_dtype() == "I8"
    assert parameter_bytes(small_int8) < 0.55 * parameter_bytes(SMALL)
    assert all(p.stat().st_size <= 16 * 2**20 for p in small_int8.glob("*.safetensors"))


@needs_int8_kernels
def test_the_packed_copy_holds_exactly_the_stored_integers() -> None:
    weight = torch.randn(48, 32, generator=torch.Generator().manual_seed(1))
    q, scale = quantize_per_channel(weight)
    dequantized = q.float() * scale
    packed = pack_int8(dequantized)
    assert packed is not None
    unpacked, _bias = torch.ops.quantized.linear_unpack(packed.fbgemm)
    assert torch.equal(packed.transposed.t(), q)
    assert torch.equal(unpacked.int_repr(), q)
    packed_weight = network.pack_weight(dequantized, int8=True)
    assert packed_weight is not None and packed_weight.kind == "int8"
    for rows in (1, 5):  # one row: fbgemm, several: per-row scales and torch._int_mm
        x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(2))
        x[0] *= 100  # an outlier row must not coarsen the others (it did with one scale per tensor)
        got = network.linear(x, dequantized, packed_weight)
        want = x @ dequantized.t()
        per_row = (got - want).norm(dim=-1) / want.norm(dim=-1)
        assert per_row.max().item() < 0.03, per_row  # activations rounded to 7-8 bits per row


def bigger_int8_checkpoint(folder: Path) -> Path:
    """A random checkpoint of the next model's shape (hidden 384, vocab 16384 shrunk to our tokenizer's
    8192 for speed), converted; every matrix is stored as int8."""
    source = write_random_checkpoint(
        folder / "random",
        TOKENIZER,
        hidden_size=384,
        intermediate_size=1152,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=64,
        global_head_dim=128,
        moe_intermediate_size=384,
        num_experts=4,
        top_k_experts=2,
    )
    return convert_checkpoint(source, folder / "int8")


@needs_int8_kernels
def test_a_random_model_of_the_bigger_shape_converts_and_runs(tmp_path: Path) -> None:
    target = bigger_int8_checkpoint(tmp_path)
    config = json.loads((target / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == INT8_METHOD
    # the int8 products against fp32 products of the same stored integers: only the kernel differs (a random
    # model's logits are small and unstructured, so bf16-vs-int8 says little about it)
    model, _ = load_model(target)
    fp32_products, _ = load_model(target)
    fp32_products.int8_weights = False
    model.prepare_cpu_inference()
    fp32_products.prepare_cpu_inference()
    assert model.decoder.layers[1].self_attn.qkv_packed.kind == "int8"
    ids = list(range(5, 205))
    want = canvas_logits(fp32_products, ids, list(range(300, 332)))
    got = canvas_logits(model, ids, list(range(300, 332)))
    # measured 0.16: a random model has no structure for errors to average out in; the per-product bound is
    # `test_the_packed_copy_holds_exactly_the_stored_integers`, the trained model's the first test here
    assert ((got - want).norm() / want.norm()).item() < 0.25


def _rewrite(folder: Path, change) -> None:
    """Apply `change(tensors)` to the one shard of an int8 checkpoint folder, in place."""
    shard = next(folder.glob("model-*.safetensors"))
    with safe_open(str(shard), framework="pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    change(tensors)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index = json.loads((folder / INDEX_FILE).read_text())
    index["weight_map"] = {key: shard.name for key in tensors}
    (folder / INDEX_FILE).write_text(json.dumps(index))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.pop("model.decoder.layers.0.mlp.down_proj.weight_scale"), "has no weight_scale"),
        (
            lambda t: t.update({"model.decoder.layers.0.mlp.down_proj.weight": torch.zeros(64, 128)}),
            "not int8",
        ),
        (
            lambda t: t.update(
                {"model.decoder.layers.0.experts.down_proj": torch.zeros(2, 64, 64, dtype=torch.int16)}
            ),
            "int16",
        ),
        (
            lambda t: t.update({"model.decoder.layers.0.mlp.down_proj.weight_scale": torch.ones(3, 1)}),
            "neither per-tensor, per-channel",
        ),
    ],
    ids=["missing scale", "float weight with a scale", "wrong integer dtype", "scale of the wrong shape"],
)
def test_a_corrupt_int8_checkpoint_is_refused(tmp_path: Path, change, message: str) -> None:
    source = write_random_checkpoint(tmp_path / "random", TOKENIZER)
    target = convert_checkpoint(source, tmp_path / "int8")
    load_model(target)  # intact: loads
    _rewrite(target, change)
    with pytest.raises(CheckpointError, match=message):
        load_model(target)


def test_an_int8_config_without_int8_weights_is_refused(tmp_path: Path) -> None:
    source = write_random_checkpoint(tmp_path / "random", TOKENIZER)
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {"quant_method": INT8_METHOD, "bits": 4}
    (source / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="only 8-bit"):
        load_model(source)


@needs_int8_kernels
def test_where_int8_products_are_slower_an_int8_model_runs_fp16_copies(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a machine where torch._int_mm has no fast kernel (decision 135) an int8 checkpoint's products run
    on fp16 copies of the same stored values: logits as close to fp32 products as the int8 ones, or closer."""
    target = bigger_int8_checkpoint(tmp_path)
    monkeypatch.setenv("DFIM_INT8_PRODUCTS", "off")
    int8_products_fast.cache_clear()
    model, _ = load_model(target)
    fp32_products, _ = load_model(target)
    fp32_products.int8_weights = False
    model.prepare_cpu_inference()
    fp32_products.prepare_cpu_inference()
    assert model.int8_weights and model.decoder.layers[1].self_attn.qkv_packed.kind == "fp16"
    ids = list(range(5, 205))
    want = canvas_logits(fp32_products, ids, list(range(300, 332)))
    got = canvas_logits(model, ids, list(range(300, 332)))
    assert ((got - want).norm() / want.norm()).item() < 1e-2
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    monkeypatch.setenv("DFIM_INT8_PRODUCTS", "auto")  # and the probe answers on its own, either way
    int8_products_fast.cache_clear()
    assert int8_products_fast() in (True, False)


def test_the_probe_reads_the_usual_spellings_and_never_picks_a_route_that_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dfim.engine.model import int8

    for value, want in (
        ("1", True),
        ("yes", True),
        ("ON", True),
        ("0", False),
        ("no", False),
        ("off", False),
    ):
        monkeypatch.setenv("DFIM_INT8_PRODUCTS", value)
        int8_products_fast.cache_clear()
        assert int8_products_fast() is want, value
    monkeypatch.setenv("DFIM_INT8_PRODUCTS", "auto")

    def broken(x, weight):
        raise RuntimeError("no int8 kernel on this build")

    monkeypatch.setattr(int8, "linear_int8", broken)
    int8_products_fast.cache_clear()
    assert int8_products_fast() is False
