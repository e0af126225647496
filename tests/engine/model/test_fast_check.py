"""The benchmark's correctness check (dfim.engine.model.fast_check) passes for the fast path as it is and fails,
naming the layer, when the fast path's view of the network is wrong in one weight or one RoPE entry.

A tiny config on the CPU, fp32, the tolerances the check states (5e-4 relative); the agreeing paths differ by
~1e-6 here, a one-weight perturbation by ~1e-2."""

from __future__ import annotations

import copy

import pytest
import torch

from dfim.engine.model.fast import FastDiffusionGemma
from dfim.engine.model.fast_check import FAST_TOLERANCE, check_fast, check_model, transformers_view
from tests.engine.model.test_fast_path import CONFIG

SHAPE = {
    key: value for key, value in CONFIG.items() if key != "num_hidden_layers"
}  # the check sets its layers
CONTEXT = 14  # past the window and three prefill chunks


def fast_over(model) -> FastDiffusionGemma:
    return FastDiffusionGemma(model, max_len=64, bucket=8, prefill_chunk=4)


def has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_check_passes_for_the_fast_path_and_transformers():
    model = check_model(SHAPE, "cpu")
    hf = transformers_view(model)[0] if has_transformers() else None
    result = check_fast(model, fast_over(model), CONTEXT, hf)
    assert result.ok, result.failures
    # every decoder layer and the logits, both self-conditioning cases, one AR token; transformers' too
    assert len(result.lines) == (2 * (4 + 1) * (2 if hf is not None else 1)) + 1


@pytest.mark.parametrize("layer", [0, 2])
def test_one_perturbed_weight_of_the_fast_paths_view_fails_at_its_layer(layer):
    model = check_model(SHAPE, "cpu")
    fast = fast_over(copy.deepcopy(model))
    with torch.no_grad():
        fast.model.decoder.layers[layer].mlp.down_proj.weight[3, 5] += 0.1  # 5 std of the init
    result = check_fast(model, fast, CONTEXT)
    assert not result.ok
    assert result.failures[0].startswith(f"fast vs ours, no self-cond, layer {layer}:")
    assert not any(
        line.startswith(f"fast vs ours, no self-cond, layer {layer - 1}:") for line in result.failures
    )


def test_a_wrong_rope_entry_of_the_fast_path_fails():
    """The fast path's own RoPE tables (not the network's): a bug of the fast path alone."""
    model = check_model(SHAPE, "cpu")
    fast = fast_over(model)
    cos, _ = fast.rope[True]  # sliding layers
    cos[CONTEXT + 2] *= 1.05  # one canvas position
    result = check_fast(model, fast, CONTEXT)
    assert result.failures[0].startswith("fast vs ours, no self-cond, layer 0:")
    rel = float(result.failures[0].split("rel err ")[1].split()[0])
    assert rel > 10 * FAST_TOLERANCE


@pytest.mark.skipif(not has_transformers(), reason="transformers not installed")
def test_a_disagreeing_transformers_model_fails_too():
    model = check_model(SHAPE, "cpu")
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.decoder.layers[1].self_attn.o_proj.weight[0, 0] += 0.1
    result = check_fast(model, fast_over(model), CONTEXT, transformers_view(other)[0])
    assert result.failures and all(line.startswith("transformers vs ours") for line in result.failures)
    assert result.failures[0].startswith("transformers vs ours, no self-cond, layer 1:")


def test_the_routing_recorder_sees_the_routers_scores():
    """The near-tie excuse reads the reference's router margins from a hook on the router's product: a router
    that bypassed its module would leave them zero and excuse any changed expert as a tie."""
    from dfim.engine.model.fast_check import RoutingRecorder

    model = check_model(SHAPE, "cpu")
    layers = model.decoder.layers
    recorder = RoutingRecorder(layers, 5, model.config.top_k_experts, torch.device("cpu"))
    with torch.no_grad():
        layers[0].router(torch.randn(5, model.config.hidden_size))
    index, margin = recorder.snapshot()
    recorder.close()
    assert (margin[0] > 0).all() and index[0].shape == (5, model.config.top_k_experts)
