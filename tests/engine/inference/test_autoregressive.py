"""The AR baseline: the network read as a causal LM, its training objective and its fill path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dfim.engine import Engine, FillRequest, Hole
from dfim.engine.inference import autoregressive
from dfim.engine.inference.canvas import CanvasPlan
from dfim.engine.model.config import ModelConfig
from dfim.engine.model.network import DiffusionGemma
from dfim.engine.training.data import build
from dfim.engine.training.examples import collate
from dfim.engine.training.objective import causal_sequence
from dfim.engine.training.presets import PRESETS
from dfim.engine.training.provenance import Root
from dfim.engine.training.train import train
from tests.engine.training.test_train_smoke import parse

REPO = Path(__file__).resolve().parents[3]
TOKENIZER_JSON = REPO / "engine" / "weights" / "dfim-small" / "tokenizer.json"


def tiny_model(seed: int = 0) -> DiffusionGemma:
    config = ModelConfig.from_dict({**PRESETS["tiny"], "vocab_size": 300, "sliding_window": 8})
    model = DiffusionGemma(config)
    model.init_weights(std=0.2, generator=torch.Generator().manual_seed(seed))
    return model.eval()


def test_cached_decoding_matches_the_training_forward() -> None:
    """Token-by-token decoding over the KV cache computes what one padded training pass computes,
    across the sliding window (8) and with left padding."""
    model = tiny_model()
    ids = torch.randint(5, 300, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
        pad = torch.zeros(1, 23, dtype=torch.bool)
        pad[:, :3] = True
        full = model.causal_forward_train(padded, pad)[:, 3:]
        cache = model.new_cache()
        first = model.causal_lm(ids[:, :12], cache)  # a context, then one token at a time
        steps = [model.causal_lm(ids[:, i : i + 1], cache, last=1) for i in range(12, 20)]
    incremental = torch.cat([first, *steps], dim=1)
    assert cache.length == 20
    torch.testing.assert_close(incremental, full, atol=1e-4, rtol=1e-4)
    # The CPU inference layout (fused and transposed weights, as Engine.load uses) computes the same.
    model.prepare_cpu_inference()
    with torch.no_grad():
        prepared = model.causal_lm(ids, model.new_cache())
    torch.testing.assert_close(prepared, full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("run", [1, 2, 3, 7, 9, 12, 16])
def test_a_few_tokens_at_a_time_compute_what_the_training_forward_computes(run: int) -> None:
    """Runs of a few tokens after a cache (drafted tokens, typed characters) take the unmasked cache path
    with a causal mask over themselves; past the sliding window (8) some of their cached keys leave a later
    token's window mid-run, which the pass must mask per token, and in runs longer than the window so do
    the run's own first tokens."""
    model = tiny_model(seed=2)
    ids = torch.randint(5, 300, (1, 30), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model.causal_forward_train(ids, torch.zeros(1, 30, dtype=torch.bool))
        cache = model.new_cache()
        parts = [model.causal_lm(ids[:, :5], cache)]
        parts += [model.causal_lm(ids[:, i : i + run], cache) for i in range(5, 30, run)]
    assert cache.length == 30
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-4, rtol=1e-4)


def test_causal_sequence_targets_real_tokens_only() -> None:
    from dfim.engine.training.examples import Example

    examples = [
        Example(context=[2, 5, 40, 4, 41, 6], canvas=[50, 51, 1, 0], pinned=[False] * 4, middle_len=2),
        Example(context=[2, 5, 4, 6], canvas=[52, 1, 0, 0], pinned=[False] * 4, middle_len=1),
    ]
    batch = collate(examples, 6, pad_id=0, pad_weight=0.0)
    ids, pad, weight = causal_sequence(batch)
    assert ids[1].tolist() == [0, 0, 2, 5, 4, 6, 52, 1, 0, 0]
    # Targets: every real token after the first, the EOS included; never a pad, never from a pad.
    assert weight[1].tolist() == [0, 0, 1, 1, 1, 1, 1, 0, 0]
    assert weight[0].tolist() == [1, 1, 1, 1, 1, 1, 1, 1, 0]
    assert pad[1].tolist() == [True, True] + [False] * 8


@pytest.fixture(scope="module")
def causal_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny causal model trained for a few steps on this repository's own Python files."""
    data = tmp_path_factory.mktemp("shards")
    build(
        data, TOKENIZER_JSON, [Root(REPO / "engine", "dir")], workers=2, val_fraction=0.1, log=lambda *_: None
    )
    out = tmp_path_factory.mktemp("run")
    result = train(
        parse(
            "--data",
            str(data),
            "--out",
            str(out),
            "--model-config",
            "tiny",
            "--batch-size",
            "8",
            "--context-tokens",
            "96",
            "--buckets",
            "16,32",
            "--workers",
            "0",
            "--lr",
            "5e-3",
            "--warmup",
            "5",
            "--steps",
            "30",
            "--log-every",
            "10",
            "--eval-every",
            "10",
            "--val-batches",
            "1",
            "--device",
            "cpu",
            "--objective",
            "causal",
        )  # fmt: skip
    )
    losses = result["losses"]
    start, end = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert end < start - 1.0, (start, end)  # the causal objective learns
    assert "val_acc" in result
    return Path(result["export"])


def test_export_is_marked_causal_and_fills_through_the_engine(causal_checkpoint: Path) -> None:
    info = json.loads((causal_checkpoint / "dfim.json").read_text())
    assert info["objective"] == "causal"
    engine = Engine.load(causal_checkpoint)
    assert engine.objective == "causal"
    request = FillRequest(prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=16)
    first = engine.fill(request)
    assert first.encoded_tokens == first.context_tokens
    assert first.stop_reason in ("eos", "stop", "max_tokens") and 1 <= first.steps <= 16
    # The cache holds the context again (not the generated tokens), so a repeat encodes nothing and,
    # greedy, gives the same text.
    assert len(engine.cache) == first.context_tokens
    again = engine.fill(request)
    assert again.encoded_tokens == 0 and again.text == first.text


def test_pinned_skeleton_is_kept_verbatim(causal_checkpoint: Path) -> None:
    engine = Engine.load(causal_checkpoint)
    for seed in range(5):
        request = FillRequest(
            prefix=f"x{seed} = compute(",
            suffix="\n",
            middle=[Hole(3), ", key=", Hole(4)],
            max_tokens=16,
        )
        result = engine.fill(request)
        assert ", key=" in result.text
        head, _, _ = result.text.partition(", key=")
        assert len(engine.tokenizer.encode(head)) >= 1  # the inner hole was filled, not skipped


def test_a_stop_string_ends_decoding(causal_checkpoint: Path) -> None:
    engine = Engine.load(causal_checkpoint)
    request = FillRequest(prefix="def f(x):\n    y = ", suffix="", max_tokens=48)
    free = engine.fill(request)
    assert len(free.text) >= 2, free.text
    stop = free.text[-1]  # a character the free text reaches late: decoding must end where it first appears
    stopped = engine.fill(FillRequest(prefix=request.prefix, suffix="", max_tokens=48, stop=(stop,)))
    assert stopped.stop_reason == "stop" and stopped.text == free.text[: free.text.find(stop)]
    assert stopped.steps <= free.steps


def test_the_greedy_decoder_takes_the_chain_s_masks() -> None:
    """`pick` applies the canvas constraints at the position decoded: banned tokens and pad everywhere, EOS
    in an inner hole, the healing set at position 0; past the plan's canvas only the banned tokens."""
    vocab, eos, pad = 20, 1, 0
    plan = CanvasPlan(
        context_ids=[3],
        length=4,
        pinned=[False, False, True, False],
        pin_ids=[0, 0, 9, 0],
        no_end=[False, True, False, False],
        open_start=3,
        heal_allowed=[5, 6],
    )
    banned = torch.zeros(vocab, dtype=torch.bool)
    banned[2] = True
    rules = autoregressive.constraints(plan, banned, eos, pad)
    assert not bool(banned[pad])  # the engine's mask is left as it was
    logits = torch.zeros(vocab)
    logits[[pad, eos, 2]] = 10.0  # the model wants exactly what it may not write
    dead = lambda p: set((autoregressive.pick(logits, rules, p).probs == 0).nonzero().flatten().tolist())  # noqa: E731
    assert dead(0) == set(range(vocab)) - {5, 6}  # healing: only the allowed tokens
    assert dead(1) == {pad, eos, 2}  # an inner hole may not end (it also lies before the pin)
    assert dead(3) == {pad, 2}  # the open hole may end
    assert dead(7) == {pad, 2}  # past the canvas the open hole goes on
    conf, token = autoregressive.pick(logits, rules, 3).top
    assert int(token) == eos and float(conf) > 0.9
    assert torch.equal(logits, torch.zeros(vocab).index_fill(0, torch.tensor([pad, eos, 2]), 10.0))  # a copy
