"""Depth up-scaling (engine/training/grow.py, scripts/grow_checkpoint.py): the grown network computes what the
source computes, round-trips through save, load and int8, trains its new layers, and stays within budget."""

from __future__ import annotations

import importlib.util
import json
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from dfim.engine.model.checkpoint import load_model, parameter_bytes, save_model, write_random_checkpoint
from dfim.engine.model.config import FULL, SLIDING, ModelConfig
from dfim.engine.model.int8 import convert_checkpoint
from dfim.engine.model.network import DiffusionGemma
from dfim.engine.training.grow import (
    ZERO_MODES,
    ZEROED,
    GrowthError,
    every_plan,
    grow,
    grown_config,
    int8_disk_size,
    largest_fitting,
    new_layer_indices,
    spread_plan,
)
from dfim.engine.training.presets import PRESETS, model_config

REPO = Path(__file__).resolve().parents[3]
TOKENIZER_JSON = REPO / "engine" / "weights" / "dfim-small" / "tokenizer.json"
SCRIPT = REPO / "scripts" / "grow_checkpoint.py"
S, F_ = SLIDING, FULL


def tiny_config(layers: int = 4, vocab: int = 512) -> ModelConfig:
    """The `tiny` preset with more layers (default_layer_types: the last full)."""
    return ModelConfig.from_dict(
        {**PRESETS["tiny"], "num_hidden_layers": layers, "vocab_size": vocab, "canvas_length": 32}
    )


def source_model(layers: int = 4, seed: int = 0) -> DiffusionGemma:
    """A random tiny model whose vectors are not all ones: norm scales, router scales and the per-layer
    scalars (decoder's and encoder's) drawn around 1, so a copy that kept its source's scalar, or a key
    mapped to the wrong layer, changes the logits."""
    gen = torch.Generator().manual_seed(seed)
    model = DiffusionGemma(tiny_config(layers))
    model.init_weights(generator=gen)
    with torch.no_grad():
        for p in list(model.parameters()) + list(model.buffers()):
            if p.ndim < 2:
                p.copy_(0.8 + 0.4 * torch.rand(p.shape, generator=gen))
    return model.eval()


def batch(vocab: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (2, 40), generator=gen), torch.randint(3, vocab, (2, 16), generator=gen)


@torch.no_grad()
def outputs(model: DiffusionGemma, context: torch.Tensor, canvas: torch.Tensor) -> list[torch.Tensor]:
    """The training forward (diffusion and causal) and the inference path (encode, then two denoising
    steps, the second self-conditioned): every way the layers are run."""
    train = model.forward_train(context, canvas)
    causal = model.causal_forward_train(context, torch.zeros_like(context, dtype=torch.bool))
    cache = model.new_cache()
    model.encode(context[:1], cache)
    first = model.denoise(canvas[:1], cache)
    return [train, causal, first, model.denoise(canvas[:1], cache, first)]


def test_config_keeps_the_full_layers_and_gives_copies_their_sources_type() -> None:
    config = tiny_config(8)  # S S S S S F S F
    assert config.layer_types == [S] * 5 + [F_, S, F_]
    assert spread_plan(config, 3) == (1, 3, 6)  # the middle of each third of the sliding layers
    assert spread_plan(config, 1) == (3,)
    assert spread_plan(config, 8) == (0, 1, 1, 2, 3, 4, 4, 6)  # more than the sliding layers: twice some
    assert every_plan(config, 4) == (3, 7)
    grown = grown_config(config, (1, 3, 6))
    assert grown.num_hidden_layers == 11
    assert grown.layer_types == [S, S, S, S, S, S, S, F_, S, S, F_]
    assert new_layer_indices(config, (1, 3, 6)) == [2, 5, 9]
    last = grown_config(config, (7, 5))  # copies of full layers are full; the last layer stays full
    assert last.layer_types == [S] * 5 + [F_, F_, S, F_, F_]
    assert ModelConfig.from_hf(grown.to_hf()) == grown  # the checkpoint's config.json says the same
    with pytest.raises(GrowthError, match="not a layer"):
        grown_config(config, (8,))
    with pytest.raises(GrowthError, match="no layer"):
        grown_config(config, ())


@pytest.mark.parametrize("zero", ZERO_MODES)
@pytest.mark.parametrize("after", [(1,), (0, 0, 3), (2, 3)])
def test_growing_leaves_the_logits_unchanged(zero: str, after: tuple[int, ...]) -> None:
    model = source_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grown = grow(model, after, zero=zero)
    assert grown.config.num_hidden_layers == 4 + len(after)
    context, canvas = batch(model.config.vocab_size)
    for want, got in zip(outputs(model, context, canvas), outputs(grown, context, canvas), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # pure: the source is untouched and shares no memory with the result
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    pointers = {p.data_ptr() for p in model.parameters()}
    assert not any(p.data_ptr() in pointers for p in grown.parameters())
    for j in new_layer_indices(model.config, after):
        layer = grown.decoder.layers[j]
        assert float(layer.layer_scalar) == 1.0
        assert float(grown.model.encoder.language_model.layers[j].layer_scalar) == 1.0
        zeroed = dict(layer.named_parameters())
        assert all(not zeroed[name].any() for name in ZEROED[zero])


def test_a_source_scalar_copied_as_it_is_would_change_the_function() -> None:
    """The per-layer scalar multiplies the residual itself: the test above would catch a copy keeping it."""
    model = source_model()
    grown = grow(model, (1,))
    with torch.no_grad():
        grown.decoder.layers[2].layer_scalar.copy_(model.decoder.layers[1].layer_scalar)
    context, canvas = batch(model.config.vocab_size)
    assert not torch.allclose(outputs(grown, context, canvas)[0], outputs(model, context, canvas)[0])


def step(model: DiffusionGemma, optimizer: torch.optim.Optimizer) -> None:
    """One optimizer step of the denoising loss on a fixed random batch."""
    context, canvas = batch(model.config.vocab_size, seed=2)
    noisy = torch.randint(
        0, model.config.vocab_size, canvas.shape, generator=torch.Generator().manual_seed(3)
    )
    loss = F.cross_entropy(model.forward_train(context, noisy).flatten(0, 1), canvas.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


@pytest.mark.parametrize("zero", ZERO_MODES)
def test_training_moves_the_zeroed_tensors_and_then_the_whole_copy(zero: str) -> None:
    grown = grow(source_model(), (1,), zero=zero).train()
    copy = grown.decoder.layers[2]
    start = {name: p.detach().clone() for name, p in copy.named_parameters()}
    # no weight decay: it would move every matrix without a gradient, and "moved" must mean "had one"
    optimizer = torch.optim.AdamW(grown.parameters(), lr=1e-3, weight_decay=0.0)
    step(grown, optimizer)
    moved = {name for name, p in copy.named_parameters() if not torch.equal(p, start[name])}
    assert set(ZEROED[zero]) <= moved  # the gradient reaches what starts at zero on the first step
    if zero == "norms":  # behind a zero scale the copy's projections wait one step
        assert "self_attn.o_proj.weight" not in moved and "experts.down_proj" not in moved
    step(grown, optimizer)
    now = dict(copy.named_parameters())
    for name in (
        "self_attn.o_proj.weight",
        "mlp.down_proj.weight",
        "experts.down_proj",
        "self_attn.q_proj.weight",
    ):
        assert not torch.equal(now[name], start[name]), name


def test_grown_checkpoint_round_trips_through_save_load_and_int8(tmp_path: Path) -> None:
    model = source_model()
    save_model(model, tmp_path / "source", dtype=torch.float32)
    grown = grow(model, (0, 2))
    save_model(grown, tmp_path / "grown", dtype=torch.float32)
    loaded, _ = load_model(tmp_path / "grown")
    assert loaded.config == grown.config
    assert all(torch.equal(v, grown.state_dict()[k]) for k, v in loaded.state_dict().items())

    # int8: the grown copy holds the source's integers, and the int8 kernels compute the same logits
    src8 = convert_checkpoint(tmp_path / "source", tmp_path / "source-int8")
    grown8 = convert_checkpoint(tmp_path / "grown", tmp_path / "grown-int8")
    assert parameter_bytes(grown8) == int8_disk_size(grown.config).total  # the budget's figure is exact
    assert parameter_bytes(src8) == int8_disk_size(model.config).total
    a, _ = load_model(src8)
    b, _ = load_model(grown8)
    assert b.int8_weights and b.config.num_hidden_layers == 6
    a.prepare_cpu_inference()
    b.prepare_cpu_inference()
    context, canvas = batch(model.config.vocab_size)
    for want, got in zip(outputs(a, context, canvas), outputs(b, context, canvas), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # growing the int8 model as loaded gives what converting the grown float model gives
    regrown = grow(a, (0, 2))
    assert regrown.int8_weights
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in regrown.state_dict().items())


def test_the_base_shape_fits_three_more_layers_in_48_mb() -> None:
    base = model_config("base", 16384, 128)
    n, size = largest_fitting(base)
    assert n == 3 and size is not None and size.total <= 48_000_000 and size.largest_shard <= 16 * 2**20
    assert size.fits(48_000_000, 16 * 2**20)
    four = int8_disk_size(grown_config(base, spread_plan(base, 4)))
    assert four.total > 48_000_000


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grow_checkpoint", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["grow_checkpoint"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def source_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("grow") / "source"
    write_random_checkpoint(folder, TOKENIZER_JSON, num_hidden_layers=4, name="tiny-source")
    notes = json.loads((folder / "dfim.json").read_text())
    (folder / "dfim.json").write_text(json.dumps({**notes, "context_tokens": 96}))
    return folder


def test_script_writes_the_grown_folder_and_refuses_a_plan_over_budget(
    source_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_script()
    size = int8_disk_size(tiny_config(4, vocab=8192)).total
    per_layer = int8_disk_size(tiny_config(5, vocab=8192)).total - size
    budget = (size + 2.5 * per_layer) / 1e6  # room for two more layers, not three
    target = tmp_path / "grown"
    argv = [str(source_folder), str(target), "--budget-mb", str(budget)]
    assert script.main([*argv, "--layers", "3"]) == 1
    err = capsys.readouterr().err
    assert "over the" in err and "at most 2 new layers fit" in err
    assert not target.exists()

    assert script.main([*argv, "--layers", "2"]) == 0
    printed = capsys.readouterr().out
    assert "most layers --layers can add within the budget: 2" in printed
    info = json.loads((target / "dfim.json").read_text())
    assert info["growth"]["after"] == [0, 2] and info["growth"]["new_layers"] == [1, 4]
    assert info["context_tokens"] == 96 and info["name"] == "tiny-source-6l"
    assert (target / "tokenizer.json").read_bytes() == TOKENIZER_JSON.read_bytes()
    source, _ = load_model(source_folder)
    grown, _ = load_model(target)
    context, canvas = batch(source.config.vocab_size)
    torch.testing.assert_close(outputs(grown, context, canvas)[0], outputs(source, context, canvas)[0])


def test_train_init_from_a_grown_folder_trains_the_grown_shape(
    source_folder: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`dfim train --init-from GROWN --model-config tiny` (the pipeline always passes a preset): the
    checkpoint's config wins, and the run's first validation scores the grown model as the source."""
    from dfim.commands.train import add_arguments, check_args
    from dfim.engine.training.data import build
    from dfim.engine.training.provenance import Root
    from dfim.engine.training.train import train

    grown = tmp_path / "grown"
    assert load_script().main([str(source_folder), str(grown), "--after", "1"]) == 0
    data = tmp_path_factory.mktemp("shards")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    build(
        data, TOKENIZER_JSON, [Root(stdlib / "json", "dir")], workers=1, val_fraction=0.3, log=lambda *_: None
    )

    def run(init: Path, out: Path) -> list[dict]:
        import argparse

        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(
            ["--data", str(data), "--out", str(out), "--tokenizer", str(TOKENIZER_JSON),
             "--model-config", "tiny", "--init-from", str(init), "--batch-size", "4", "--buckets", "16",
             "--workers", "0", "--steps", "1", "--val-batches", "1", "--device", "cpu", "--no-compile"]
        )  # fmt: skip
        check_args(args)
        assert args.context_tokens == 96  # from the grown folder's notes, as the source's
        train(args)
        return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]

    grown_log = run(grown, tmp_path / "run-grown")
    source_log = run(source_folder, tmp_path / "run-source")
    assert grown_log[0]["start"] and grown_log[0]["val_loss"] == pytest.approx(
        source_log[0]["val_loss"], abs=1e-4
    )
    exported, _ = load_model(tmp_path / "run-grown" / "export")
    assert exported.config.num_hidden_layers == 5
    assert exported.config.layer_types == [S, S, S, S, F_]
