"""Training on CPU: FIM examples are well formed, a tiny model's loss falls, resume continues, export loads."""

from __future__ import annotations

import argparse
import json
import random
import re
import sysconfig
from pathlib import Path

import pytest
import torch

from dfim.commands.train import add_arguments
from dfim.engine.model.tokenizer import Tokenizer
from dfim.engine.training.data import build
from dfim.engine.training.examples import Batch, ExampleSettings, FimExamples, collate
from dfim.engine.training.objective import add_noise, lr_at
from dfim.engine.training.provenance import Root
from dfim.engine.training.shards import TokenShards
from dfim.engine.training.state import load_state
from dfim.engine.training.train import train

REPO = Path(__file__).resolve().parents[3]
TOKENIZER_JSON = REPO / "engine" / "weights" / "dfim-small" / "tokenizer.json"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shards built from two packages of the running Python's standard library (email, json): real code
    that does not change with this repository. The repository's own files did, and the margins below
    moved with every edit (a near-copy of engine/inference/sampler.py once broke one)."""
    out = tmp_path_factory.mktemp("shards")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    roots = [Root(stdlib / "email", "dir"), Root(stdlib / "json", "dir")]
    build(out, TOKENIZER_JSON, roots, workers=2, val_fraction=0.1, log=lambda *_: None)
    return out


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(TOKENIZER_JSON)


def test_fim_examples_are_contiguous_source(data_dir: Path, tok: Tokenizer) -> None:
    settings = ExampleSettings(context_tokens=256, buckets=(16, 32, 64))
    shards = TokenShards(data_dir, "train")
    sources = [tok.decode(shards.doc(i).tolist()) for i in range(len(shards))]
    examples = FimExamples(shards, tok, settings, random.Random(1))
    kinds: set[str] = set()
    for _ in range(200):
        ex = examples.example(63)
        kinds.add(ex.kind)
        ctx = ex.context
        assert len(ctx) <= 256
        assert ctx[:2] == [tok.bos_id, tok.fim_suffix_id] and ctx[-1] == tok.fim_middle_id
        split = ctx.index(tok.fim_prefix_id)
        suffix, prefix = tok.decode(ctx[2:split]), tok.decode(ctx[split + 1 : -1])
        length = len(ex.canvas)
        assert length in settings.buckets and ex.middle_len + 1 <= length
        middle = tok.decode(ex.canvas[: ex.middle_len])
        assert ex.canvas[ex.middle_len] == tok.eos_id
        assert all(i == tok.pad_id for i in ex.canvas[ex.middle_len + 1 :])
        assert not any(ex.pinned[ex.middle_len + 1 :])  # pins sit on the middle and its eos only
        # prefix + middle + suffix is one contiguous piece of a real file (windows cut on whole lines).
        assert any(prefix + middle + suffix in src for src in sources), (prefix[-40:], middle, suffix[:40])
    assert kinds >= {"line", "lines", "random"}


def test_collate_noise_and_weights(data_dir: Path, tok: Tokenizer) -> None:
    settings = ExampleSettings(context_tokens=128, buckets=(32,))
    examples = FimExamples(TokenShards(data_dir, "train"), tok, settings, random.Random(2))
    exs = [examples.example(31) for _ in range(16)]
    batch: Batch = collate(exs, 128, tok.pad_id, 0.5)
    assert batch.context.shape == (16, 128) and batch.canvas.shape == (16, 32)
    # Left padding: pads first, then the real context ending with <fim_middle>.
    assert bool((batch.context[:, -1] == tok.fim_middle_id).all())
    assert bool((batch.context[batch.context_pad] == tok.pad_id).all())
    assert bool((batch.weight[batch.pinned] == 0).all())
    noisy, t = add_noise(batch.canvas, batch.pinned, tok.vocab_size, 0.02, torch.Generator().manual_seed(0))
    assert bool((noisy[batch.pinned] == batch.canvas[batch.pinned]).all())  # pins are never noised
    changed = (noisy != batch.canvas).float().mean(dim=1)
    assert float(torch.corrcoef(torch.stack([changed, t[:, 0]]))[0, 1]) > 0.5  # more noise at larger t


def test_lr_schedule() -> None:
    assert lr_at(0, 0.0, 1.0, 10, 0.25, 0.1) == pytest.approx(0.1)
    assert lr_at(50, 0.5, 1.0, 10, 0.25, 0.1) == pytest.approx(1.0)
    assert lr_at(50, 0.875, 1.0, 10, 0.25, 0.1) == pytest.approx(0.55)
    assert lr_at(50, 2.0, 1.0, 10, 0.25, 0.1) == pytest.approx(0.1)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    # the tokenizer the fixtures' shards were built with (the default model's is another vocabulary)
    args = parser.parse_args(["--tokenizer", str(TOKENIZER_JSON), *argv])
    args.compile = False
    return args


def test_tiny_training_loss_falls_and_resume_continues(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    common = [
        "--data", str(data_dir), "--out", str(out), "--model-config", "tiny", "--batch-size", "8",
        "--context-tokens", "96", "--buckets", "16,32", "--workers", "0", "--lr", "5e-3", "--warmup", "5",
        "--total-steps", "40", "--log-every", "10", "--eval-every", "20", "--val-batches", "1", "--device", "cpu",
    ]  # fmt: skip
    first = train(parse(*common, "--steps", "30"))
    printed = (
        capsys.readouterr().out
    )  # each log line says how far the run is toward --steps, and how long is left
    assert re.search(r"^step 10 .* 33% ETA \d+m\d\ds$", printed, re.M), printed
    losses = first["losses"]
    assert len(losses) == 30
    start, end = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert end < start - 1.0, (start, end)

    state = json.loads((out / "state" / "trainer.json").read_text())
    assert state["step"] == 30 and state["tokens"] > 0
    second = train(parse(*common, "--steps", "33", "--resume"))
    assert second["step"] == 33 and len(second["losses"]) == 3
    assert second["losses"][0] < start - 1.0  # continued from trained weights, not a fresh init

    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert any("val_loss" in r for r in rows) and rows[-1]["final"] and rows[-1]["step"] == 33

    # The optimizer state round-trips without pickle, and the export is a loadable checkpoint.
    from dfim.engine.model.checkpoint import load_model
    from dfim.engine.model.network import DiffusionGemma

    model, _ = load_model(out / "export")
    assert isinstance(model, DiffusionGemma) and (out / "export" / "tokenizer.json").is_file()
    from dfim.engine.model.checkpoint import read_info

    info = read_info(out / "export")
    assert info["name"] == "run" and info["random"] is False  # no --name: the --out folder's name
    assert all(p.stat().st_size <= 16 * 2**20 for p in (out / "export").glob("*.safetensors"))
    fresh = DiffusionGemma(model.config)
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in fresh.parameters() if p.ndim >= 2]},
            {"params": [p for p in fresh.parameters() if p.ndim < 2]},
        ]
    )
    scalars = load_state(out, fresh, optimizer)
    assert scalars["step"] == 33 and len(optimizer.state) == len(list(fresh.parameters()))

    # A run continuing the export first scores it on the validation split: the baseline it is compared with.
    cont = tmp_path / "continued"
    args = [a if a != str(out) else str(cont) for a in common]
    train(parse(*args, "--steps", "1", "--init-from", str(out / "export")))
    first_row = json.loads((cont / "train_log.jsonl").read_text().splitlines()[0])
    assert first_row["step"] == 0 and first_row["start"] is True
    assert first_row["val_loss"] == pytest.approx(rows[-1]["val_loss"], rel=0.02)


def test_context_lm_branch_is_the_encoder_read_to_the_end() -> None:
    """The hidden states behind the context LM loss are the causal encoder's, last feed-forward
    included, left padding ignored; asking for them leaves the canvas logits unchanged."""
    from dfim.engine.model.network import DiffusionGemma
    from dfim.engine.training.presets import model_config

    model = DiffusionGemma(model_config("tiny", 512, 32))
    model.init_weights(generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    context = torch.randint(3, 512, (1, 11), generator=g)
    canvas = torch.randint(0, 512, (1, 16), generator=g)
    padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), context], dim=1)
    pad = torch.zeros(1, 16, dtype=torch.bool)
    pad[:, :5] = True
    with torch.no_grad():
        logits, hidden = model.forward_train_lm(padded, canvas, None, pad)
        plain = model.forward_train(padded, canvas, None, pad)
        scalars = [layer.layer_scalar for layer in model.model.encoder.language_model.layers]
        want = model._causal_pass(context, model.new_cache(), scalars)
    assert hidden is not None and hidden.shape == (1, 16, model.config.hidden_size)
    assert (hidden[:, 5:] - want).abs().max().item() < 1e-5
    assert torch.equal(logits, plain)


def tiny_lm_run(data_dir: Path, out: Path, *extra: str) -> Path:
    """30 steps of a tiny diffusion model on CPU, seeded alike: runs differ only by `extra`."""
    train(parse(
        "--data", str(data_dir), "--out", str(out), "--model-config", "tiny", "--batch-size", "8",
        "--context-tokens", "64", "--buckets", "16", "--workers", "0", "--lr", "5e-3", "--warmup", "5",
        "--steps", "30", "--log-every", "5", "--val-batches", "0", "--device", "cpu", *extra,
    ))  # fmt: skip
    return out


@pytest.fixture(scope="module")
def plain_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The control arm: no auxiliary LM loss."""
    return tiny_lm_run(data_dir, tmp_path_factory.mktemp("plain") / "run")


def probe_batch(data_dir: Path) -> Batch:
    from dfim.engine.training.examples import BatchStream

    settings = ExampleSettings(context_tokens=64, buckets=(16,))
    return next(iter(BatchStream(str(data_dir), "train", str(TOKENIZER_JSON), settings, 8, seed=99)))


def test_context_lm_loss_teaches_the_encoder_next_tokens(
    data_dir: Path, plain_run: Path, tmp_path: Path
) -> None:
    """Two tiny runs from the same seed, with and without the context LM loss: only the first logs it,
    records it in dfim.json, and ends with an encoder that predicts the next context token better."""
    from dfim.engine.model.checkpoint import load_model, read_info
    from dfim.engine.training.objective import context_lm_loss

    with_lm = tiny_lm_run(data_dir, tmp_path / "lm", "--context-lm-weight", "1.0")
    rows = [json.loads(line) for line in (with_lm / "train_log.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "lm_loss" in r]) == 7  # step 1, then every 5 steps
    assert "lm_loss" not in (plain_run / "train_log.jsonl").read_text()
    assert read_info(with_lm / "export")["context_lm_weight"] == 1.0

    batch = probe_batch(data_dir)
    losses = []
    for folder in (with_lm, plain_run):
        model, _ = load_model(folder / "export")
        with torch.no_grad():
            _, hidden = model.forward_train_lm(batch.context, batch.canvas, None, batch.context_pad)
            losses.append(float(context_lm_loss(model, hidden, batch)))
    # 6.74 vs 7.55 when written (without the LM term the two runs are identical)
    assert losses[0] < losses[1] - 0.4, losses


def test_causal_weight_teaches_the_draft_the_whole_middle(
    data_dir: Path, plain_run: Path, tmp_path: Path
) -> None:
    """The AR FIM term trains what the single-line draft decodes: the middle and its EOS read left to
    right after the context. Against the control its causal loss on the middle ends clearly lower."""
    from dfim.engine.model.checkpoint import load_model, read_info
    from dfim.engine.training.objective import causal_sequence, weighted_loss

    with_causal = tiny_lm_run(data_dir, tmp_path / "causal", "--causal-weight", "1.0")
    rows = [json.loads(line) for line in (with_causal / "train_log.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "lm_loss" in r]) == 7
    assert read_info(with_causal / "export")["causal_weight"] == 1.0

    batch = probe_batch(data_dir)
    n = batch.context.shape[1]
    losses = []
    for folder in (with_causal, plain_run):
        model, _ = load_model(folder / "export")
        ids, pad, weight = causal_sequence(batch)
        weight[:, : n - 1] = 0  # the middle and its EOS only: what the draft must produce
        with torch.no_grad():
            logits = model.causal_forward_train(ids, pad)
        losses.append(float(weighted_loss(logits[:, :-1], ids[:, 1:], weight)))
    assert losses[0] < losses[1] - 0.15, losses  # 4.91 vs 5.18 when written: 30 steps only


def test_causal_weight_and_context_lm_weight_are_not_combined(data_dir: Path, tmp_path: Path) -> None:
    from dfim.commands.checks import InputError
    from dfim.commands.train import check_args

    args = parse(
        "--data", str(data_dir), "--out", str(tmp_path / "run"), "--causal-weight", "1",
        "--context-lm-weight", "0.5", "--device", "cpu",
    )  # fmt: skip
    with pytest.raises(InputError, match="drop --context-lm-weight"):
        check_args(args)


def test_context_lm_weight_is_refused_for_a_causal_run(data_dir: Path, tmp_path: Path) -> None:
    args = parse(
        "--data", str(data_dir), "--out", str(tmp_path / "run"), "--objective", "causal",
        "--context-lm-weight", "0.5", "--device", "cpu", "--steps", "1",
    )  # fmt: skip
    with pytest.raises(SystemExit, match="diffusion objective"):
        train(args)


def test_span_mix_and_pins_shape_the_training_stream_only(data_dir: Path, tok: Tokenizer) -> None:
    from dfim.engine.training.train import example_mix

    settings = ExampleSettings(context_tokens=256, buckets=(16, 32, 64))
    args = parse("--data", str(data_dir), "--out", "unused", "--span-mix", "1,0,0", "--pin-subset-p", "0")
    lines_only = ExampleSettings(**{**settings.__dict__, **example_mix(args, settings)})
    assert lines_only.span_mix == (1.0, 0.0, 0.0) and lines_only.pin_subset_p == 0.0
    examples = FimExamples(TokenShards(data_dir, "train"), tok, lines_only, random.Random(3))
    drawn = [examples.example(63) for _ in range(60)]
    assert {ex.kind for ex in drawn} == {"line"}
    # Only the pinned-run kind of example is left: no scattered pins.
    for ex in drawn:
        pins = [i for i, p in enumerate(ex.pinned) if p]
        assert pins == list(range(pins[0], pins[-1] + 1)) if pins else True

    assert example_mix(parse("--data", "d", "--out", "o"), settings) == {}  # unset: the defaults
    for bad in ("0.5,0.5", "0.5,0.6,0.1", "a,b,c", "-0.1,0.6,0.5"):
        with pytest.raises(SystemExit, match="span-mix"):
            example_mix(parse("--data", "d", "--out", "o", f"--span-mix={bad}"), settings)
    with pytest.raises(SystemExit, match="pin-subset-p"):
        example_mix(parse("--data", "d", "--out", "o", "--pin-subset-p", "0.95"), settings)


def test_ordered_noise_leaves_a_clean_prefix_as_the_sampler_window_does(
    data_dir: Path, tok: Tokenizer, tmp_path: Path
) -> None:
    settings = ExampleSettings(context_tokens=128, buckets=(32,))
    examples = FimExamples(TokenShards(data_dir, "train"), tok, settings, random.Random(4))
    batch = collate([examples.example(31) for _ in range(64)], 128, tok.pad_id, 0.5)
    gen = torch.Generator().manual_seed(0)
    default, _ = add_noise(batch.canvas, batch.pinned, tok.vocab_size, 0.02, torch.Generator().manual_seed(0))
    same, _ = add_noise(batch.canvas, batch.pinned, tok.vocab_size, 0.02, gen, 0.0, tok.pad_id)
    assert torch.equal(default, same)  # p = 0 draws nothing extra: default runs keep their stream

    def shape(noisy: torch.Tensor) -> tuple[list[int], float, float]:
        """First changed position per row, share of rows whose first change lies in the middle + EOS,
        share of rows noised lightly (< 30%) right of their first change."""
        content = (batch.canvas != tok.pad_id).sum(dim=1)
        firsts, inside, light = [], 0, 0
        for row in range(len(noisy)):
            changed = (noisy[row] != batch.canvas[row]).nonzero().flatten().tolist()
            if not changed:
                continue
            first = changed[0]  # the cut, or a little right of it where the first noise draws missed
            firsts.append(first)
            inside += int(first <= content[row])
            light += int(len(changed) < 0.3 * int((~batch.pinned[row, first:]).sum()))
        return firsts, inside / len(firsts), light / len(firsts)

    noisy, _ = add_noise(batch.canvas, batch.pinned, tok.vocab_size, 0.02, gen, 1.0, tok.pad_id)
    assert bool((noisy[batch.pinned] == batch.canvas[batch.pinned]).all())
    firsts, inside, light = shape(noisy)
    assert inside >= 0.85  # cuts lie inside the middle and its EOS
    assert len(set(firsts)) > 5 and min(firsts) <= 2  # spread over the middle, some at its start
    assert light <= 0.05  # right of the cut: a high noise level, t in (0.5, 1)
    assert shape(default)[2] >= 0.15  # (i.i.d. noise at t ~ U(0.02, 1) leaves many rows lightly noised)
    with pytest.raises(SystemExit, match="ordered-noise-p"):
        train(parse("--data", str(data_dir), "--out", str(tmp_path / "o"), "--ordered-noise-p", "1.5"))
