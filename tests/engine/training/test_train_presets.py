"""The `base` preset: the shape the issue asks for, under the on-disk budget, trained on 1,024+ tokens."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dfim.engine.model.config import FULL, SLIDING
from dfim.engine.model.network import DiffusionGemma
from dfim.engine.training.distributed import active_parameters, step_flops
from dfim.engine.training.presets import model_config
from dfim.engine.training.run import resolve_context_tokens

# 1-byte weights must fit the 48 MB checkpoint with room for scales and the tokenizer.
MAX_BASE_PARAMETERS = 45_000_000


def built(preset: str, vocab_size: int) -> DiffusionGemma:
    with torch.device("meta"):  # shapes only
        return DiffusionGemma(model_config(preset, vocab_size, 128))


def test_base_is_wider_than_small_with_the_same_layer_pattern() -> None:
    base, small = built("base", 16384), built("small", 8192)
    c = base.config
    assert (c.hidden_size, c.num_hidden_layers, c.intermediate_size) == (384, 8, 1152)
    assert (c.num_attention_heads, c.head_dim, c.num_key_value_heads) == (6, 64, 2)
    assert (c.global_head_dim, c.global_kv_heads) == (128, 1)
    assert (c.num_experts, c.top_k_experts, c.moe_intermediate_size) == (4, 2, 384)
    assert c.layer_types == [SLIDING] * 5 + [FULL, SLIDING, FULL] == small.config.layer_types
    total, active = base.num_parameters(), active_parameters(base)
    assert 30e6 < total < MAX_BASE_PARAMETERS, total  # 36.1 M at vocab 16,384
    # Two of four experts idle per token: active = total less half of the experts' weights.
    experts = sum(
        layer.experts.gate_up_proj.numel() + layer.experts.down_proj.numel() for layer in base.decoder.layers
    )
    assert active == total - experts // 2


def test_base_trains_on_a_context_its_sliding_window_covers(tmp_path: Path) -> None:
    args = argparse.Namespace(
        context_tokens=None, out=str(tmp_path), resume=False, init_from=None, model_config="base"
    )
    context = resolve_context_tokens(args)
    assert context >= 1024
    assert built("base", 16384).config.sliding_window >= context  # sliding == full attention in training
    assert resolve_context_tokens(argparse.Namespace(**{**vars(args), "model_config": "small"})) == 512
    assert resolve_context_tokens(argparse.Namespace(**{**vars(args), "context_tokens": 2048})) == 2048


def test_step_flops_count_the_extra_passes() -> None:
    plain = step_flops(10, 100, self_conditioned=False, causal_extra=False, causal=False)
    assert plain == 6 * 10 * 100
    assert step_flops(10, 100, True, True, False) == (6 + 2 + 6) * 10 * 100
    assert step_flops(10, 100, True, True, True) == plain  # a causal run has one pass
