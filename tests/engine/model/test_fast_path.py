"""The fast GPU path (engine/model/fast.py) computes the same function as dfim.engine.model.network, checked on the CPU.

fp32, a tiny config with both layer kinds, a context longer than the sliding window, prefill in
chunks and a small graph bucket, so every static-cache slice and mask is exercised. CUDA graphs and
torch.compile are not available here; they replay exactly this code on the GPU.
"""

from __future__ import annotations

import json

import pytest
import torch

from dfim.engine.api import CheckpointError
from dfim.engine.inference.fast_backend import fixed_step_block
from dfim.engine.model.checkpoint import write_random_checkpoint
from dfim.engine.model.config import ModelConfig
from dfim.engine.model.experts import moe_gathered, moe_grouped, moe_padded, pick_gpu_kernel
from dfim.engine.model.fast import FastDiffusionGemma, expected_experts_touched, load_fast
from dfim.engine.model.network import DiffusionGemma, causal_mask

TOLERANCE = 1e-4
TOKENIZER = "engine/weights/dfim-small/tokenizer.json"

CONFIG = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=7,  # 5 sliding, 1 full, 1 forced full
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    global_head_dim=16,
    num_global_key_value_heads=1,
    sliding_window=6,
    num_experts=16,
    top_k_experts=4,
    moe_intermediate_size=16,
    canvas_length=8,
)


def make_model(seed: int = 0) -> DiffusionGemma:
    torch.manual_seed(seed)
    model = DiffusionGemma(ModelConfig(**CONFIG)).eval()
    model.init_weights(std=0.2)
    with torch.no_grad():  # non-trivial norms and scalars, encoder and decoder scalars different
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand_like(b))
    return model


def fast_of(model: DiffusionGemma) -> FastDiffusionGemma:
    return FastDiffusionGemma(model, max_len=64, bucket=8, prefill_chunk=4)


def causal_logits(model: DiffusionGemma, ids: torch.Tensor) -> torch.Tensor:
    """The network as a plain causal LM (encoder scalars, every layer's feed-forward) -> [1, T, V]."""
    t = ids.shape[1]
    positions = torch.arange(t)
    tables = model.rotary(positions[None], torch.float32)
    masks = {False: causal_mask(positions, positions, None), True: causal_mask(positions, positions, 6)}
    x = model.decoder.embed(ids)
    for i, layer in enumerate(model.decoder.layers):
        attn = layer.self_attn
        q, k, v = attn.project(layer.input_layernorm(x), *tables[model.config.layer_types[i]])
        x = x + layer.post_attention_layernorm(attn.attend(q, k, v, masks[attn.is_sliding][None, None]))
        x = layer.feed_forward(x, model.model.encoder.language_model.layers[i].layer_scalar)
    return model.logits(x)


@torch.no_grad()
def test_denoise_logits_match_reference():
    model = make_model()
    fast = fast_of(model)
    g = torch.Generator().manual_seed(1)
    context = torch.randint(0, 96, (1, 13), generator=g)  # longer than the window, 4 prefill chunks
    canvas = torch.randint(0, 96, (1, 8), generator=g)
    self_cond = torch.randn(1, 8, 96, generator=g) * 3
    cache = model.new_cache()
    model.encode(context, cache)
    fast.encode(context[:, :5])
    fast.encode(context[:, 5:])  # a second encode continues the cache
    assert fast.length == 13
    for sc in (None, self_cond):
        want = model.denoise(canvas, cache, sc)
        got = fast.denoise(canvas, sc)
        assert (got - want).abs().max().item() <= TOLERANCE
    # truncating (the user edited the end of the context) and re-encoding stays exact
    fast.truncate(9)
    cache.truncate(9)
    other = torch.randint(0, 96, (1, 6), generator=g)
    fast.encode(other)
    model.encode(other, cache)
    assert (
        fast.denoise(canvas, self_cond) - model.denoise(canvas, cache, self_cond)
    ).abs().max() <= TOLERANCE


@torch.no_grad()
def test_padded_encode_chunks_write_what_the_plain_encoder_writes():
    """On a GPU each encode chunk is padded to one of ENCODE_CHUNKS (one graph each): the padding's rows
    change nothing the context's tokens see, and the cache holds only the context."""
    model = make_model()
    fast = FastDiffusionGemma(model, max_len=128, bucket=8, prefill_chunk=32)
    fast.pad_encode = True
    g = torch.Generator().manual_seed(2)
    context = torch.randint(0, 96, (1, 21), generator=g)
    canvas = torch.randint(0, 96, (1, 8), generator=g)
    cache = model.new_cache()
    model.encode(context, cache)
    fast.encode(context[:, :3])  # padded to 16
    fast.encode(context[:, 3:])  # 18 tokens, padded to 64
    assert fast.length == 21
    for i, (k, v) in enumerate(fast.context_rows(0, 21)):
        want_k, want_v = cache.get(i)
        assert want_k is not None and want_v is not None
        assert (k - want_k).abs().max() <= TOLERANCE and (v - want_v).abs().max() <= TOLERANCE
    assert (fast.denoise(canvas) - model.denoise(canvas, cache)).abs().max() <= TOLERANCE
    with pytest.raises(ValueError, match="rows"):
        fast.context_rows(0, 22)


@pytest.mark.parametrize("pad", [False, True])
@torch.no_grad()
def test_encode_returns_the_context_lm_logits_of_its_last_rows(pad):
    """The encoder's draft reads next-token logits from the fast path's encode: those of the plain network's
    context LM, also where the rows asked for span two chunks and the chunks are padded."""
    model = make_model()
    fast = FastDiffusionGemma(model, max_len=128, bucket=8, prefill_chunk=4)
    fast.pad_encode = pad
    g = torch.Generator().manual_seed(3)
    context, ids = torch.randint(0, 96, (1, 7), generator=g), torch.randint(0, 96, (1, 6), generator=g)
    cache = model.new_cache()
    model.encode(context, cache)
    want = model.context_lm(ids, cache, last=3)
    assert fast.encode(context) is None
    got = fast.encode(ids, logit_rows=3)  # rows 3..5: the first chunk's last and the second chunk's two
    assert got is not None and got.shape == want.shape and got.dtype == torch.float32
    assert (got - want).abs().max() <= TOLERANCE
    assert fast.length == 13
    with pytest.raises(ValueError, match="logits"):
        fast.encode(ids, logit_rows=7)


@pytest.mark.parametrize("impl", [moe_grouped, moe_padded, moe_gathered])
@torch.no_grad()
def test_expert_implementations_match_dense_reference(impl):
    model = make_model()
    experts = model.decoder.layers[0].experts
    g = torch.Generator().manual_seed(2)
    x = torch.randn(24, 32, generator=g)
    index = torch.stack([torch.randperm(16, generator=g)[:4] for _ in range(24)])
    index[:6] = torch.tensor([0, 1, 2, 3])  # crowd some experts, leave others empty
    weights = torch.rand(24, 4, generator=g)
    want = experts._dense(x, weights, index)
    got = impl(x, weights, index, experts.gate_up_proj, experts.down_proj)
    assert (got - want).abs().max().item() <= TOLERANCE


def test_pick_gpu_kernel_prefers_grouped_when_it_works():
    model = make_model()
    fast = fast_of(model)
    assert fast.moe == pick_gpu_kernel(fast.layers[0].experts, torch.device("cpu"), torch.float32)
    assert fast.moe in ("grouped", "padded")
    if hasattr(torch, "_grouped_mm"):
        assert fast.moe == "grouped"


@torch.no_grad()
def test_autoregressive_logits_match_causal_forward():
    model = make_model()
    fast = fast_of(model)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 96, (1, 16), generator=g)
    want = causal_logits(model, ids)
    fast.encode(ids[:, :9])
    for pos in range(9, 16):  # crosses a bucket edge (8, 16) and the window
        got = fast.ar_logits(int(ids[0, pos]))
        assert (got - want[:, pos]).abs().max().item() <= TOLERANCE


@torch.no_grad()
def test_greedy_decode_follows_the_causal_argmax():
    model = make_model()
    fast = fast_of(model)
    g = torch.Generator().manual_seed(4)
    context = torch.randint(0, 96, (1, 10), generator=g)
    fast.encode(context[:, :-1])
    out = fast.generate_ar(int(context[0, -1]), 7)
    assert fast.length == 16
    seq = torch.cat([context, out], dim=1)
    want = causal_logits(model, seq).argmax(dim=-1)[:, 9:-1]
    assert torch.equal(out, want)


@torch.no_grad()
def test_shorter_canvases_and_a_copied_context_match_reference():
    """The engine's canvases are often shorter than the model's largest, and its context comes from the
    plain encoder's KV cache (`copy_context`), not from the fast path's own prefill."""
    model = make_model()
    fast = fast_of(model)
    g = torch.Generator().manual_seed(6)
    context = torch.randint(0, 96, (1, 11), generator=g)
    cache = model.new_cache()
    model.encode(context, cache)
    fast.copy_context(cache, 0)
    assert fast.length == 11
    for length in (3, 8, 5):  # three graphs' worth of shapes, one buffer
        canvas = torch.randint(0, 96, (1, length), generator=g)
        self_cond = torch.randn(1, length, 96, generator=g) * 3
        got = fast.denoise(canvas, self_cond)
        assert got.shape == (1, length, 96)
        assert (got - model.denoise(canvas, cache, self_cond)).abs().max().item() <= TOLERANCE
    # the user edits the end of the context: rows up to the edit stay, the rest is copied again
    cache.truncate(7)
    model.encode(torch.randint(0, 96, (1, 9), generator=g), cache)
    fast.truncate(7)
    fast.copy_context(cache, 7)
    canvas = torch.randint(0, 96, (1, 8), generator=g)
    assert (fast.denoise(canvas) - model.denoise(canvas, cache)).abs().max().item() <= TOLERANCE
    with pytest.raises(ValueError, match="the fast path runs"):
        fast.denoise(torch.zeros(1, 9, dtype=torch.long))


@torch.no_grad()
def test_candidate_rows_in_one_pass_match_the_reference_row_by_row():
    """Rows of a candidate batch share one pass: each sits at the positions after the context, attends the
    context and itself only, so its logits are its own single-row logits, for any row count that fits."""
    model = make_model()
    fast = fast_of(model)
    g = torch.Generator().manual_seed(9)
    context = torch.randint(0, 96, (1, 10), generator=g)  # longer than the sliding window
    cache = model.new_cache()
    model.encode(context, cache)
    fast.copy_context(cache, 0)
    for rows, length in ((2, 4), (3, 2), (4, 2)):
        canvas = torch.randint(0, 96, (rows, length), generator=g)
        self_cond = torch.randn(rows, length, 96, generator=g) * 3
        for sc in (None, self_cond):
            got = fast.denoise(canvas, sc)
            assert got.shape == (rows, length, 96)
            for r in range(rows):
                row_sc = None if sc is None else sc[r : r + 1]
                want = model.denoise(canvas[r : r + 1], cache, row_sc)
                assert (got[r : r + 1] - want).abs().max().item() <= TOLERANCE
    # rows that together overflow the canvas buffers are refused (the backend then runs them one by one)
    assert not fast.fits_rows(3, 4) and fast.fits_rows(2, 4)
    with pytest.raises(ValueError, match="the fast path runs"):
        fast.denoise(torch.zeros(3, 4, dtype=torch.long))


@torch.no_grad()
def test_fixed_step_block_runs_the_shared_chain_for_every_step():
    model = make_model()
    fast = fast_of(model)
    fast.encode(torch.randint(0, 96, (1, 12)))
    ids, state = fixed_step_block(
        fast.denoise,
        length=8,
        vocab_size=96,
        eos_id=model.config.eos_token_id,
        pad_id=model.config.pad_token_id,
        steps=16,
        generator=torch.Generator().manual_seed(5),
    )
    assert state.step == 16 and int(state.steps[0]) == 16 and state.stop_reason == ["max_steps"]
    assert ids.shape == (1, 8) and int(ids.min()) >= 0 and int(ids.max()) < 96
    eos = (ids[0] == model.config.eos_token_id).nonzero().flatten()
    if len(eos):  # everything after the first EOS is pad
        assert bool((ids[0, int(eos[0]) + 1 :] == model.config.pad_token_id).all())
    assert fast.length == 12  # denoising never moves the context


def test_expected_experts_touched():
    assert expected_experts_touched(1, 128, 8) == pytest.approx(8 / 128)
    assert expected_experts_touched(256, 128, 8) > 0.9999


def test_loader_reads_a_saved_checkpoint_and_rejects_other_architectures(tmp_path):
    folder = write_random_checkpoint(tmp_path / "ckpt", TOKENIZER, num_experts=4, top_k_experts=2)
    fast = load_fast(folder, device="cpu", dtype=torch.float32, max_len=256, bucket=64)
    fast.encode(torch.randint(0, fast.vocab, (1, 5)))
    assert fast.denoise(torch.randint(0, fast.vocab, (1, 64))).shape == (1, 64, fast.vocab)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"], config["architectures"] = "llama", ["LlamaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="not a DiffusionGemma checkpoint"):
        load_fast(folder, device="cpu", dtype=torch.float32)


@torch.no_grad()
def test_experts_kept_in_fp8_run_on_the_fast_path_as_on_the_network():
    """An FP8 checkpoint's experts on a GPU stay FP8 (no bf16 copy); the fast path picks an FP8 kernel for
    them (on the CPU the widening reference) and computes what the plain network computes."""
    from dfim.engine.model.experts import Experts
    from dfim.engine.model.experts_fp8 import keep_fp8, quantize_experts

    model = make_model()
    for m in model.modules():
        if isinstance(m, Experts) and m.fp8 is None:
            keep_fp8(
                m, quantize_experts(m.gate_up_proj.data, m.down_proj.data), "w8a16_reference", torch.float32
            )
    fast = fast_of(model)
    assert fast.moe == "w8a16_reference"
    g = torch.Generator().manual_seed(2)
    context = torch.randint(0, 96, (1, 11), generator=g)
    canvas = torch.randint(0, 96, (1, 8), generator=g)
    cache = model.new_cache()
    model.encode(context, cache)
    fast.encode(context)
    assert (fast.denoise(canvas) - model.denoise(canvas, cache)).abs().max().item() <= TOLERANCE
