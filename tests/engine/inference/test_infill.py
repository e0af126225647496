"""Engine end to end on a random tiny checkpoint: the text is noise, the mechanics must hold."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from dfim.engine import Engine, FillCancelled, FillRequest, Hole, SamplerSettings
from dfim.engine.api import CheckpointError, EngineError
from dfim.engine.model.checkpoint import write_random_checkpoint

TOKENIZER_JSON = Path(__file__).resolve().parents[3] / "engine" / "weights" / "dfim-small" / "tokenizer.json"
FAST = SamplerSettings(max_steps=4)  # a random model never gets confident: keep runs short


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("ckpt"), TOKENIZER_JSON, seed=1)


@pytest.fixture(scope="module")
def engine(checkpoint):
    return Engine.load(checkpoint)


def fill(engine, **kw):
    kw.setdefault("settings", FAST)
    kw.setdefault("seed", 0)
    return engine.fill(FillRequest(**kw))


def test_load_reads_the_random_marker_and_settings(engine, checkpoint):
    assert engine.is_random and engine.model_name == "random-tiny"
    assert engine.settings == SamplerSettings()  # generation_config.json holds the released defaults
    assert engine.path == Path(checkpoint)


def test_checkpoint_sampler_notes_round_trip(tmp_path):
    """dfim's own sampler knobs (no field in generation_config.json) live in dfim.json and load back;
    a bad value is a one-line checkpoint error, not a crash."""
    from dfim.engine.model.checkpoint import load_model, read_settings, save_model

    model, _ = load_model(write_random_checkpoint(tmp_path / "a", TOKENIZER_JSON, seed=1))
    ours = SamplerSettings(window=8, rank="likelihood", draft=True, draft_from="middle")
    save_model(model, tmp_path / "b", ours, info={"name": "b"})
    assert read_settings(tmp_path / "b") == ours
    info = json.loads((tmp_path / "b" / "dfim.json").read_text())
    sampler = {"window": 8, "rank": "likelihood", "draft": True, "draft_from": "middle"}
    assert info == {"name": "b", "sampler": sampler}
    # Saving with the released sampler drops a stale entry the notes were copied with.
    save_model(model, tmp_path / "c", SamplerSettings(), info=info)
    assert "sampler" not in json.loads((tmp_path / "c" / "dfim.json").read_text())
    assert read_settings(tmp_path / "c") == SamplerSettings()
    for bad in ({"window": "wide"}, [8], {"rank": "Likelihood"}, {"rank": None}, {"draft_from": "suffix"}):
        (tmp_path / "b" / "dfim.json").write_text(json.dumps({"sampler": bad}))
        with pytest.raises(CheckpointError, match="bad sampler setting"):
            read_settings(tmp_path / "b")


def test_shipped_model_uses_the_order_window():
    from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR, read_settings

    assert read_settings(DEFAULT_MODEL_DIR).window == 8  # decision 20


def test_fill_returns_text_and_accounting(engine):
    result = fill(engine, prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=16)
    assert isinstance(result.text, str)
    assert result.canvas_length == 16 and result.blocks == 1
    assert 1 <= result.steps <= FAST.max_steps
    assert result.stop_reason in ("stable", "eos_confident", "max_steps")
    assert 1 <= result.tokens <= 16
    assert result.context_tokens == len(engine.cache) and result.latency_ms > 0
    assert "".join(s.text for s in result.token_scores) == result.text
    assert all(0.0 < s.confidence <= 1.0 for s in result.token_scores)


def test_pins_appear_verbatim_over_seeds(engine):
    middle = ["def scale(", Hole(3), "):\n    return ", Hole(4)]
    for seed in range(6):
        result = fill(engine, prefix="import math\n\n", suffix="\n", middle=middle, seed=seed)
        assert result.text.startswith("def scale(")
        pinned = "".join(s.text for s in result.token_scores if s.pinned)
        assert pinned == "def scale():\n    return "
        assert "):\n    return " in result.text
        assert all(s.confidence == 1.0 for s in result.token_scores if s.pinned)


def test_skeleton_ending_with_a_string_ends_with_it(engine):
    for seed in range(3):
        result = fill(
            engine, prefix="x = ", suffix="\ny = 2\n", middle=["compute(", Hole(2), ")\n"], seed=seed
        )
        assert result.text.startswith("compute(") and result.text.endswith(")\n")
        assert len([s for s in result.token_scores if not s.pinned]) == 2  # the inner hole is filled to width


def test_token_healing_keeps_the_typed_characters(engine):
    tok = engine.tokenizer
    allowed = [tok.token_bytes(i) for i in engine.table.starting_with(b" ret")]
    for seed in range(4):
        result = fill(engine, prefix="def f(xs):\n    ret", suffix="\n", max_tokens=16, seed=seed)
        healed = b" ret" + result.text.encode()
        assert any(healed.startswith(t) for t in allowed)


def test_seeded_fills_are_reproducible(engine):
    a = fill(engine, prefix="for i in range(", suffix="):\n    pass\n", seed=7, max_tokens=16)
    b = fill(engine, prefix="for i in range(", suffix="):\n    pass\n", seed=7, max_tokens=16)
    c = fill(engine, prefix="for i in range(", suffix="):\n    pass\n", seed=8, max_tokens=16)
    assert a.text == b.text and [s.confidence for s in a.token_scores] == [
        s.confidence for s in b.token_scores
    ]
    assert a.text != c.text


def test_context_cache_encodes_only_what_changed(engine):
    prefix = "import os\n\n\ndef total_size(paths):\n    size = 0\n    for path in paths:\n        size += os.path.getsize("
    engine.cache.reset()
    first = fill(engine, prefix=prefix, suffix="\n    return size\n", max_tokens=16)
    assert first.encoded_tokens == first.context_tokens
    again = fill(engine, prefix=prefix, suffix="\n    return size\n", max_tokens=16)
    assert again.encoded_tokens == 0
    # "pat" only extends the healed partial token "(pat": the context is unchanged
    assert (
        fill(engine, prefix=prefix + "pat", suffix="\n    return size\n", max_tokens=16).encoded_tokens == 0
    )
    # "path" completes it: "(path" and <fim_middle> are new, the 35 tokens before come from the cache
    typed = fill(engine, prefix=prefix + "path", suffix="\n    return size\n", max_tokens=16)
    assert typed.encoded_tokens == 2 < typed.context_tokens


def test_cancel_raises_between_steps_and_the_engine_stays_usable(engine):
    seen = []
    request = FillRequest(
        prefix="x = ",
        suffix="\n",
        settings=SamplerSettings(max_steps=10, early_stop=False),
        cancel=lambda: len(seen) >= 2,
        on_step=seen.append,
    )
    with pytest.raises(FillCancelled):
        engine.fill(request)
    assert [s.step for s in seen] == [1, 2]
    assert seen[0].max_steps == 10 and seen[0].canvas_length == 64 and isinstance(seen[0].argmax_text, str)
    assert fill(engine, prefix="x = ", suffix="\n").steps == FAST.max_steps


def test_stop_tokens_are_the_tokens_holding_a_stop_string(engine):
    tok = engine.tokenizer
    mask = engine._stop_tokens(("\n",), b"")
    assert mask is not None and mask.shape == (engine.vocab_size,)
    for i in range(tok.vocab_size):
        assert bool(mask[i]) == (b"\n" in tok.token_bytes(i)), i
    assert not bool(mask[tok.eos_id]) and not bool(mask[tok.pad_id])
    assert engine._stop_tokens((), b"") is None
    # healed bytes holding the stop string belong to the prefix: the first token would hold it anyway
    assert engine._stop_tokens(("\n",), b"\n") is None
    assert engine._stop_tokens(("\n",), b" ") is mask


def test_a_fill_ends_at_the_block_holding_a_stop_token(tmp_path):
    folder = write_random_checkpoint(tmp_path / "small-canvas", TOKENIZER_JSON, seed=2, canvas_length=16)
    engine = Engine.load(folder)
    checked = 0
    for seed in range(12):
        free = fill(engine, prefix="data = [", suffix="]\n", max_tokens=64, seed=seed)
        first_block = "".join(s.text for s in free.token_scores[:16])
        if free.blocks < 2 or "\n" not in first_block:
            continue
        # the same seed with a newline stop: the random model never settles, so the first canvas is
        # denoised the same way; its newline ends the fill and no further canvas is denoised
        line = fill(engine, prefix="data = [", suffix="]\n", max_tokens=64, seed=seed, stop=("\n",))
        assert line.blocks == 1 and line.steps == FAST.max_steps
        assert line.text == free.text.split("\n")[0]
        checked += 1
    assert checked >= 2


def test_candidates_are_denoised_together(engine):
    result = fill(engine, prefix="name = ", suffix="\n", candidates=3, max_tokens=16)
    assert len(result.alternatives) <= 2 and result.text not in result.alternatives
    assert all(isinstance(a, str) for a in result.alternatives)


def test_long_fill_continues_in_further_canvases(tmp_path):
    folder = write_random_checkpoint(tmp_path / "small-canvas", TOKENIZER_JSON, seed=2, canvas_length=16)
    engine = Engine.load(folder)
    result = fill(engine, prefix="data = [", suffix="]\n", max_tokens=40)
    if result.tokens < 48:  # an EOS ended it early: rare for a random model, but then fewer blocks
        pytest.skip("the random model emitted an EOS")
    assert result.canvas_length == 16 and result.blocks == 3
    assert result.steps == 3 * FAST.max_steps
    # the first two blocks were encoded after the context, so the third canvas' positions continued
    assert len(engine.cache) == result.context_tokens + 32


def test_concurrent_fills_are_serialized(engine):
    results, errors = [], []

    def worker(seed):
        try:
            results.append(fill(engine, prefix="y = ", suffix="\n", seed=seed, max_tokens=16))
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 3


def test_load_errors_name_the_path(tmp_path, checkpoint):
    with pytest.raises(CheckpointError, match="not found"):
        Engine.load(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in Path(checkpoint).iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "config.json").write_text("{ not json")
    with pytest.raises(CheckpointError, match="config.json"):
        Engine.load(broken)
    (broken / "config.json").write_bytes((Path(checkpoint) / "config.json").read_bytes())
    (broken / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        Engine.load(broken)


def test_settings_round_trip_through_a_request(engine):
    off = replace(FAST, early_stop=False, max_steps=3)
    assert fill(engine, prefix="a = ", suffix="\n", settings=off, max_tokens=16).steps == 3
    assert json.dumps(fill(engine, prefix="a = ", suffix="\n", max_tokens=16).text)


def test_a_fill_run_between_two_steps_of_another_keeps_both_answers(engine):
    outer_kw = dict(prefix="def area(r):\n    return ", suffix="\n", seed=3)
    inner_kw = dict(prefix="import os\n\n\ndef main():\n    ", suffix="", seed=4)
    alone_outer = fill(engine, **outer_kw)
    alone_inner = fill(engine, **inner_kw, cache_slot="elsewhere")  # encoded from scratch, as nested below
    inner = []

    def run_inner() -> None:
        if not inner:
            inner.append(fill(engine, **inner_kw, cache_slot="inline"))

    outer = fill(engine, **outer_kw, between_steps=run_inner)
    assert len(inner) == 1 and inner[0].encoded_tokens == inner[0].context_tokens
    assert inner[0].text == alone_inner.text and inner[0].steps == alone_inner.steps
    # the outer fill's context survived in its own slot: same canvas, same answer
    assert outer.text == alone_outer.text and outer.steps == alone_outer.steps
    assert set(engine.caches) >= {"main", "inline"}


def test_a_nested_fill_may_not_take_the_cache_slot_of_the_fill_it_runs_in(engine):
    def same_slot() -> None:
        fill(engine, prefix="x = ", suffix="\n")

    with pytest.raises(EngineError, match="slot 'main' is in use"):
        fill(engine, prefix="y = ", suffix="\n", between_steps=same_slot)
    assert fill(engine, prefix="y = ", suffix="\n").steps >= 1  # the engine is usable afterwards


def test_likelihood_rank_picks_the_candidate_the_encoder_lm_prefers(engine):
    import torch

    from dfim.engine.inference.canvas import build_canvas
    from dfim.engine.model.kv_cache import KVCache

    prefix, suffix = "def area(r):\n    return 3.14 *", "\n\nprint(area(2))\n"
    kw = dict(prefix=prefix, suffix=suffix, stop=("\n",), candidates=4, seed=5, max_tokens=16)
    ranked = fill(engine, **kw, settings=replace(FAST, rank="likelihood"))
    texts = [ranked.text, *ranked.alternatives]
    assert len(texts) >= 2  # a random model's candidates differ

    plan = build_canvas(
        FillRequest(prefix=prefix, suffix=suffix, max_tokens=16), engine.tokenizer, engine.table, 128
    )
    heal = plan.heal_bytes.decode()

    def log_likelihood(text: str, after: str = suffix) -> float:  # from scratch: context, text, what follows
        ids = plan.context_ids[:-1] + engine.tokenizer.encode(heal + text + after[:48])
        n = len(plan.context_ids) - 1
        with torch.inference_mode():
            logits = engine.model.context_lm(torch.tensor([ids]), KVCache(len(engine.model.decoder.layers)))[
                0
            ]
        logp = torch.log_softmax(logits[n - 1 : -1], dim=-1).gather(1, torch.tensor(ids[n:])[:, None])
        return float(logp.sum()) if text.strip() else float("-inf")

    scores = [log_likelihood(t) for t in texts]
    assert scores[0] == pytest.approx(max(scores), abs=1e-3)
    # a fill shown as a new line above the code is scored against the document the user gets
    after = "\n    " + suffix
    other = fill(engine, **kw, settings=replace(FAST, rank="likelihood"), scored_suffix=after)
    rescored = {t: log_likelihood(t, after) for t in [other.text, *other.alternatives]}
    assert rescored[other.text] == pytest.approx(max(rescored.values()), abs=1e-3)
    # the context cache is left holding exactly the context: the same fill again encodes nothing
    again = fill(engine, **kw, settings=replace(FAST, rank="likelihood"))
    assert again.encoded_tokens == 0 and again.text == ranked.text


def test_an_unknown_rank_is_an_engine_error(engine):
    with pytest.raises(EngineError, match="rank must be one of"):
        fill(engine, prefix="x = ", suffix="\n", settings=replace(FAST, rank="loudest"))


def test_a_missing_folder_and_a_missing_gpu_are_both_named(tmp_path: Path) -> None:
    """Fixing one of two wrong settings must not only bring up the other: a load names both."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    with pytest.raises(EngineError) as info:
        Engine.load(str(tmp_path / "absent"), device="cuda")
    assert "checkpoint folder not found" in str(info.value) and "CUDA is not available" in str(info.value)
    with pytest.raises(CheckpointError, match="checkpoint folder not found"):
        Engine.load(str(tmp_path / "absent"))
