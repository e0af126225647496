"""Our network against the reference: transformers' DiffusionGemmaForBlockDiffusion (pinned 5.17.0).

A random tiny reference model is saved with `save_pretrained`, loaded into ours with our loader, and
both must produce the same encoder+decoder logits (max abs diff <= 1e-4, fp32), with and without
self-conditioning, for a context longer than the sliding window and a second, cached encode.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from dfim.engine.model.checkpoint import load_model, read_settings, save_model  # noqa: E402
from dfim.engine.model.config import ModelConfig  # noqa: E402

TOLERANCE = 1e-4

TEXT_CONFIG = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=7,  # 5 sliding, 1 full, then 1 sliding forced to full: both kinds twice
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    global_head_dim=16,
    num_global_key_value_heads=1,
    sliding_window=6,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=16,
)


def make_reference(tmp_path, bf16_values: bool = False, **overrides):
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    from dfim.engine.model.config import TINY_VISION_CONFIG

    torch.manual_seed(0)
    config = DiffusionGemmaConfig(
        text_config={**TEXT_CONFIG, **overrides}, vision_config=dict(TINY_VISION_CONFIG), canvas_length=8
    )
    ref = DiffusionGemmaForBlockDiffusion(config).eval()
    with torch.no_grad():  # make the scales and norms non-trivial so a wrong wiring shows
        for p in ref.parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
        for name, b in ref.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand_like(b))
        if bf16_values:  # fp32 tensors holding bf16 values, as a bf16 checkpoint loads (fp16 fits them)
            for p in ref.parameters():
                p.copy_(p.bfloat16().float())
    ref.save_pretrained(tmp_path / "ref")
    return ref


def reference_logits(ref, context, canvas, self_cond):
    from transformers import DynamicCache

    cache = DynamicCache(config=ref.config.text_config)
    with torch.no_grad():
        out = ref(
            input_ids=context,
            past_key_values=cache,
            decoder_input_ids=canvas,
            self_conditioning_logits=self_cond,
        )
    return out.logits


@pytest.mark.parametrize("experts_mode", ["dense", "sparse"])
def test_logits_match_reference(tmp_path, experts_mode, monkeypatch):
    ref = make_reference(tmp_path)
    ours, _ = load_model(tmp_path / "ref")
    monkeypatch.setattr(
        "dfim.engine.model.network.Experts.mode", experts_mode
    )  # both expert paths must match
    g = torch.Generator().manual_seed(1)
    context = torch.randint(0, 96, (1, 11), generator=g)  # longer than the sliding window (6)
    canvas = torch.randint(0, 96, (1, 8), generator=g)
    self_cond = torch.randn(1, 8, 96, generator=g) * 3

    for sc in (None, self_cond):
        want = reference_logits(ref, context, canvas, sc)
        with torch.no_grad():
            cache = ours.new_cache()
            ours.encode(context[:, :7], cache)  # in two pieces: the second one reads the cache
            ours.encode(context[:, 7:], cache)
            got = ours.denoise(canvas, cache, sc)
            train = ours.forward_train(context, canvas, sc)
        assert (got - want).abs().max().item() <= TOLERANCE
        assert (train - want).abs().max().item() <= TOLERANCE


def test_forward_train_left_padding_matches_unpadded(tmp_path):
    make_reference(tmp_path)
    ours, _ = load_model(tmp_path / "ref")
    g = torch.Generator().manual_seed(2)
    context = torch.randint(3, 96, (1, 9), generator=g)
    canvas = torch.randint(0, 96, (1, 8), generator=g)
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), context], dim=1)
    pad = torch.zeros(1, 13, dtype=torch.bool)
    pad[:, :4] = True
    with torch.no_grad():
        want = ours.forward_train(context, canvas)
        got = ours.forward_train(padded, canvas, context_pad=pad)
    assert (got - want).abs().max().item() <= TOLERANCE


def test_candidates_broadcast_over_one_cache(tmp_path):
    make_reference(tmp_path)
    ours, _ = load_model(tmp_path / "ref")
    g = torch.Generator().manual_seed(3)
    context = torch.randint(3, 96, (1, 9), generator=g)
    canvases = torch.randint(0, 96, (3, 8), generator=g)
    with torch.no_grad():
        cache = ours.new_cache()
        ours.encode(context, cache)
        batch = ours.denoise(canvases, cache)
        single = torch.cat([ours.denoise(canvases[i : i + 1], cache) for i in range(3)])
    assert (batch - single).abs().max().item() <= TOLERANCE


def test_our_checkpoint_loads_in_transformers(tmp_path):
    from transformers import DiffusionGemmaForBlockDiffusion, GenerationConfig

    ref = make_reference(tmp_path)
    ours, _ = load_model(tmp_path / "ref")
    save_model(ours, tmp_path / "ours", dtype=torch.float32, max_shard_bytes=20_000)
    assert len(list((tmp_path / "ours").glob("*.safetensors"))) > 1  # really sharded
    back = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "ours").eval()
    g = torch.Generator().manual_seed(4)
    context = torch.randint(0, 96, (1, 10), generator=g)
    canvas = torch.randint(0, 96, (1, 8), generator=g)
    assert (
        reference_logits(back, context, canvas, None) - reference_logits(ref, context, canvas, None)
    ).abs().max() <= TOLERANCE
    generation = GenerationConfig.from_pretrained(tmp_path / "ours")
    assert generation.max_denoising_steps == 48
    assert read_settings(tmp_path / "ours").entropy_bound == 0.1
    assert ModelConfig.from_hf(json.loads((tmp_path / "ours" / "config.json").read_text())) == ours.config


def test_cpu_inference_layout_keeps_logits_and_state_dict(tmp_path):
    """`prepare_cpu_inference` (fused q/k/v and gate/up products, transposed storage) only moves memory:
    same state_dict values, same logits as the reference, and its state_dict loads into a plain model."""
    ref = make_reference(tmp_path)
    ours, _ = load_model(tmp_path / "ref")
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    ours.prepare_cpu_inference()
    after = ours.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    g = torch.Generator().manual_seed(5)
    context = torch.randint(0, 96, (1, 11), generator=g)
    canvases = torch.randint(0, 96, (2, 8), generator=g)
    self_cond = torch.randn(2, 8, 96, generator=g) * 3
    for sc in (None, self_cond):
        want = torch.cat(
            [
                reference_logits(ref, context, canvases[i : i + 1], None if sc is None else sc[i : i + 1])
                for i in range(2)
            ]
        )
        with torch.inference_mode():
            cache = ours.new_cache()
            ours.encode(context, cache)
            got = ours.denoise(canvases, cache, sc)
            again = ours.denoise(canvases, cache, sc)  # the cached RoPE tables
        assert (got - want).abs().max().item() <= TOLERANCE
        assert torch.equal(got, again)
    copy, _ = load_model(tmp_path / "ref")
    copy.load_state_dict(ours.state_dict())  # views are read like any tensor
    with torch.no_grad():
        cache = copy.new_cache()
        copy.encode(context, cache)
        assert (
            copy.denoise(canvases, cache, None) - ours.denoise(canvases, cache, None)
        ).abs().max() <= TOLERANCE


def test_fp16_copies_serve_few_rows_with_the_reference_logits(tmp_path):
    """With weights that fit fp16 (a bf16 checkpoint's), `prepare_cpu_inference` adds fbgemm fp16 copies for
    products of a few rows; the logits stay the reference's, in the denoiser and the causal draft pass."""
    from dfim.engine.model import experts, network, ops

    ref = make_reference(tmp_path, bf16_values=True)
    ours, _ = load_model(tmp_path / "ref")
    plain, _ = load_model(tmp_path / "ref")
    ours.prepare_cpu_inference()
    layer = ours.decoder.layers[0]
    if ours.head_packed is None:
        pytest.skip("no fbgemm fp16 GEMM in this torch build (ARM)")
    assert layer.self_attn.qkv_packed is not None and all(p is not None for p in layer.experts.down_packed)
    g = torch.Generator().manual_seed(7)
    context = torch.randint(0, 96, (1, 11), generator=g)
    canvas = torch.randint(0, 96, (1, 8), generator=g)
    self_cond = torch.randn(1, 8, 96, generator=g) * 3
    calls = []
    real = ops.linear

    def counting(x, weight, packed=None):
        calls.append(
            packed is not None and packed.fresh_for(weight) and x.numel() <= ops.PACKED_MAX_ROWS * x.shape[-1]
        )
        return real(x, weight, packed)

    for sc in (None, self_cond):
        want = reference_logits(ref, context, canvas, sc)
        with torch.inference_mode():
            cache = ours.new_cache()
            ours.encode(context, cache)
            network.linear = experts.linear = counting  # every module that runs products
            try:
                got = ours.denoise(canvas, cache, sc)
            finally:
                network.linear = experts.linear = real
        assert (got - want).abs().max().item() <= TOLERANCE
    assert calls and all(calls)  # every product of the 8-row canvas went through an fp16 copy
    with torch.inference_mode():  # a drafted token after the context: the causal pass, one row
        drafted = ours.context_lm(torch.tensor([[5]]), cache, last=1)
        plain_cache = plain.new_cache()
        plain.encode(context, plain_cache)
        want_drafted = plain.context_lm(torch.tensor([[5]]), plain_cache, last=1)
    assert (drafted - want_drafted).abs().max().item() <= TOLERANCE


def test_weights_loaded_after_the_fp16_copies_are_what_the_model_computes(tmp_path):
    """A state_dict loaded into a prepared model writes through the parameters that view the fused q/k/v and
    gate/up matrices (their own version counters): the fp16 copies must not answer for the old weights."""
    make_reference(tmp_path, bf16_values=True)
    ours, _ = load_model(tmp_path / "ref")
    other, _ = load_model(tmp_path / "ref")
    with torch.no_grad():  # other weights that still fit fp16 (halving is exact)
        for p in other.parameters():
            if p.ndim >= 2:
                p.mul_(0.5)
    ours.prepare_cpu_inference()
    if ours.head_packed is None:
        pytest.skip("no fbgemm fp16 GEMM in this torch build (ARM)")
    for assign in (False, True):
        ours.load_state_dict(other.state_dict(), assign=assign)
        g = torch.Generator().manual_seed(3)
        context, canvas = torch.randint(0, 96, (1, 9), generator=g), torch.randint(0, 96, (1, 8), generator=g)
        with torch.inference_mode():
            got, want = [], []
            for model, out in ((ours, got), (other, want)):
                cache = model.new_cache()
                model.encode(context, cache)
                out.append(model.denoise(canvas, cache))
                out.append(model.context_lm(torch.tensor([[7]]), cache, last=1))
        for a, b in zip(got, want, strict=True):
            assert (a - b).abs().max().item() <= TOLERANCE, assign


def test_preparing_under_inference_mode_serves_without_fp16_copies(tmp_path):
    make_reference(tmp_path, bf16_values=True)
    ours, _ = load_model(tmp_path / "ref")
    plain, _ = load_model(tmp_path / "ref")
    with torch.inference_mode():  # inference tensors have no version counter: no copies, and no error
        ours.prepare_cpu_inference()
        assert ours.head_packed is None and ours.decoder.layers[0].self_attn.o_packed is None
        cache, plain_cache = ours.new_cache(), plain.new_cache()
        ours.encode(torch.tensor([[3, 4, 5]]), cache)
        plain.encode(torch.tensor([[3, 4, 5]]), plain_cache)
        canvas = torch.tensor([[6, 7, 8, 9]])
        assert (ours.denoise(canvas, cache) - plain.denoise(canvas, plain_cache)).abs().max() <= TOLERANCE
