"""Checkpoint folders without weights whose dfim.json asks for random ones (engine/model/random_init.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dfim.engine.api import CheckpointError, FillRequest
from dfim.engine.inference.fill import Engine
from dfim.engine.model.checkpoint import (
    DEFAULT_MODEL_DIR,
    INFO_FILE,
    count_parameters,
    load_model,
    read_config,
    write_random_checkpoint,
)
from dfim.engine.model.config import RELEASED_26B_A4B
from dfim.engine.model.random_init import RANDOM_INIT

TOKENIZER = DEFAULT_MODEL_DIR / "tokenizer.json"
TOKENIZER_VOCAB = 16_384  # dfim-base's; the model below has more ids, as the 26B shape (262,144) does
EXTRA = 64


def unstored(folder: Path, **kw) -> Path:
    return write_random_checkpoint(folder, TOKENIZER, stored=False, vocab_size=TOKENIZER_VOCAB + EXTRA, **kw)


def test_a_folder_without_weights_loads_random_ones_made_on_the_device(tmp_path: Path) -> None:
    folder = unstored(tmp_path / "a", seed=3, init_dtype=torch.bfloat16)
    assert not list(folder.glob("*.safetensors"))
    assert json.loads((folder / INFO_FILE).read_text())[RANDOM_INIT] == {
        "seed": 3,
        "std": 0.02,
        "dtype": "bfloat16",
    }
    model, _ = load_model(folder)  # asked for fp32: the folder's dtype wins, as its weights are made here
    params = dict(model.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.bfloat16}
    assert all(bool(torch.isfinite(p).all()) for p in params.values())
    embed = params["model.decoder.embed_tokens.weight"].detach().float()
    assert embed.shape == (TOKENIZER_VOCAB + EXTRA, 64)
    assert 0.015 < float(embed.std()) < 0.025  # init_weights' normal(0, 0.02)
    assert all(bool((b == 1).all()) for b in model.buffers())  # the layer scalars, as a checkpoint has them
    again, _ = load_model(folder)
    assert torch.equal(again.decoder.embed_tokens.weight, model.decoder.embed_tokens.weight)  # the seed holds


def test_without_a_dtype_the_loader_s_dtype_is_used(tmp_path: Path) -> None:
    model, _ = load_model(unstored(tmp_path / "a"), dtype=torch.float32)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_the_26b_shape_round_trips_without_weights(tmp_path: Path) -> None:
    folder = write_random_checkpoint(
        tmp_path / "big",
        TOKENIZER,
        stored=False,
        init_dtype=torch.bfloat16,
        name="random-26b",
        **RELEASED_26B_A4B,
    )
    config = read_config(folder)
    assert (config.vocab_size, config.num_hidden_layers, config.num_experts) == (262_144, 30, 128)
    assert abs(count_parameters(config) - 25.25e9) < 0.05e9  # the released 26B-A4B's text stack
    assert sum(p.stat().st_size for p in folder.iterdir()) < 5_000_000  # the tokenizer, and no 52 GB


def test_the_engine_never_emits_ids_the_tokenizer_lacks(tmp_path: Path, monkeypatch) -> None:
    engine = Engine.load(unstored(tmp_path / "a"))
    assert engine.is_random and engine.tokenizer.vocab_size == TOKENIZER_VOCAB
    assert bool(engine.banned[TOKENIZER_VOCAB:].all())
    logits = engine.model.logits

    def prefer_missing_ids(hidden: torch.Tensor) -> torch.Tensor:
        out = logits(hidden)
        out[..., TOKENIZER_VOCAB:] += 1e4  # the model would pick nothing else
        return out

    monkeypatch.setattr(engine.model, "logits", prefer_missing_ids)
    seen: list[int] = []
    token_bytes = engine.tokenizer.token_bytes

    def spy(token: int) -> bytes:
        seen.append(token)
        return token_bytes(token) if token < TOKENIZER_VOCAB else b"?"

    monkeypatch.setattr(engine.tokenizer, "token_bytes", spy)
    request = FillRequest(prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=16, candidates=2)
    engine.fill(request)
    assert seen and max(seen) < TOKENIZER_VOCAB
    engine.banned[TOKENIZER_VOCAB:] = False  # the control: without the ban, those ids are what it writes
    seen.clear()
    engine.fill(request)
    assert max(seen) >= TOKENIZER_VOCAB


def test_a_folder_without_weights_that_asks_for_none_is_refused(tmp_path: Path) -> None:
    folder = unstored(tmp_path / "a")
    info = json.loads((folder / INFO_FILE).read_text())
    del info[RANDOM_INIT]
    (folder / INFO_FILE).write_text(json.dumps(info))
    with pytest.raises(CheckpointError, match=r"no weights .*does not ask for random ones \(\"random_init\""):
        load_model(folder)


def test_random_init_beside_stored_weights_is_refused(tmp_path: Path) -> None:
    folder = write_random_checkpoint(tmp_path / "a", TOKENIZER)  # with weights
    info = json.loads((folder / INFO_FILE).read_text())
    (folder / INFO_FILE).write_text(json.dumps({**info, RANDOM_INIT: {"seed": 1}}))
    with pytest.raises(CheckpointError, match="asks for random weights, but it holds model"):
        load_model(folder)


def test_writing_a_folder_without_weights_over_one_with_weights_drops_them(tmp_path: Path) -> None:
    write_random_checkpoint(tmp_path / "a", TOKENIZER)
    folder = unstored(tmp_path / "a")
    assert not list(folder.glob("model*")) and load_model(folder)[0] is not None


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("yes", "expected a JSON object"),
        ({"seed": -1}, "seed"),
        ({"seed": True}, "seed"),
        ({"dtype": "int8"}, "dtype 'int8'"),
        ({"std": 0}, "std"),
        ({"sede": 1}, "unknown keys"),
    ],
)
def test_a_bad_random_init_entry_names_the_file(tmp_path: Path, entry: object, words: str) -> None:
    folder = unstored(tmp_path / "a")
    info = json.loads((folder / INFO_FILE).read_text())
    (folder / INFO_FILE).write_text(json.dumps({**info, RANDOM_INIT: entry}))
    with pytest.raises(CheckpointError, match=f"{INFO_FILE}: bad {RANDOM_INIT}.*{words}"):
        load_model(folder)


def test_the_engine_loads_weights_in_the_dtype_asked_for(tmp_path: Path) -> None:
    folder = unstored(tmp_path / "a")
    assert {p.dtype for p in Engine.load(folder).model.parameters()} == {torch.float32}  # the CPU's default
    wanted = Engine.load(folder, dtype=torch.bfloat16)  # a GPU's default; checks ask for fp32 there
    assert {p.dtype for p in wanted.model.parameters()} == {torch.bfloat16}
