"""The denoising loop against synthetic logits (no model): building a state, running the chain, freezing finished
rows, committing, seeding and cancelling."""

from __future__ import annotations

import math

import pytest
import torch

from dfim.engine.api import FillCancelled, SamplerSettings
from dfim.engine.inference import sampler
from dfim.engine.inference import sampler_steps as steps
from dfim.engine.inference.sampler_state import pad_after_eos
from dfim.engine.inference.sampler_steps import Chain, build_chain
from tests.engine.inference.sampler_helpers import EOS, PAD, V, constant, make_state, peaked


def test_entropy_step_measures_the_processed_distribution():
    settings = SamplerSettings(max_steps=1, t_min=0.5, t_max=1.0)
    state = make_state(length=2)
    logits = torch.zeros(1, 2, V)
    logits[0, 0, 3] = 100.0  # position 0 certain, position 1 uniform
    sampler.denoise_step(state, build_chain(settings), logits)
    assert state.entropy[0, 0].item() == pytest.approx(0.0, abs=1e-6)
    assert state.entropy[0, 1].item() == pytest.approx(math.log(V), rel=1e-5)
    assert torch.allclose(sampler.confidence(state), torch.exp(-state.entropy))


def test_pins_hold_their_token_at_every_step_over_many_seeds():
    pins = {0: 7, 3: 9, 5: 11}
    settings = SamplerSettings(max_steps=6, early_stop=False)
    for seed in range(100):
        g = torch.Generator().manual_seed(10_000 + seed)

        def denoiser(canvas, self_cond, g=g):
            logits = torch.randn(canvas.shape[0], canvas.shape[1], V, generator=g) * 3
            logits[:, :, [7, 9, 11]] = -50.0  # the model never wants the pinned tokens
            return logits

        state = make_state(length=8, batch=2, pins=pins, seed=seed)
        seen = []
        committed = sampler.run(
            state, build_chain(settings), denoiser, on_step=lambda s, seen=seen: seen.append(s.canvas)
        )
        for canvas in [state.canvas, *seen]:
            assert canvas[:, [0, 3, 5]].tolist() == [[7, 9, 11]] * 2
        assert committed[:, [0, 3, 5]].tolist() == [[7, 9, 11]] * 2
        assert state.accepted[:, [0, 3, 5]].all()


def test_warm_start_keeps_part_of_the_old_tokens():
    length = 200
    init = torch.full((length,), 13)
    mask = torch.ones(length, dtype=torch.bool)
    state = make_state(length=length, init_ids=init, init_mask=mask, init_noise=0.5)
    kept = (state.canvas[0] == 13).float().mean().item()
    assert 0.35 < kept < 0.65  # about half renoised (noise hits 13 only 1/V of the time)
    state = make_state(length=length, init_ids=init, init_mask=mask, init_noise=0.0)
    assert (state.canvas[0] == 13).all()


def test_early_stop_false_runs_max_steps():
    settings = SamplerSettings(max_steps=9, early_stop=False)
    logits = peaked([9, 10, EOS, PAD])
    state = make_state(length=4)
    sampler.run(state, build_chain(settings), constant(logits))
    assert (state.step, state.stop_reason, state.steps.tolist()) == (9, ["max_steps"], [9])


def test_finished_rows_are_frozen_while_others_continue():
    settings = SamplerSettings(max_steps=6)
    logits = peaked([5, 6, 7, 8], batch=2)
    logits[1] = torch.randn(4, V)  # row 1 never gets confident
    state = make_state(length=4, batch=2)
    snapshots = []
    rows_seen = []

    def denoiser(canvas, self_cond):  # once row 0 has finished, the decoder is asked for row 1 only
        rows_seen.append(canvas.shape[0])
        assert self_cond is None or self_cond.shape[0] == canvas.shape[0]
        return logits[-canvas.shape[0] :].clone()

    sampler.run(
        state, build_chain(settings), denoiser, on_step=lambda s: snapshots.append(s.canvas[0].clone())
    )
    assert state.stop_reason == ["stable", "max_steps"]
    assert state.steps.tolist() == [2, 6]
    assert rows_seen == [2, 2, 1, 1, 1, 1]  # a finished candidate costs no decoder pass
    for canvas in snapshots[2:]:
        assert torch.equal(canvas, snapshots[1])
    assert state.argmax[0].tolist() == [5, 6, 7, 8]


def test_commit_pads_after_the_first_eos_and_forces_pins():
    ids = torch.tensor([[5, EOS, 7, EOS, 8], [5, 6, 7, 8, 9]])
    assert pad_after_eos(ids, EOS, PAD).tolist() == [[5, EOS, PAD, PAD, PAD], [5, 6, 7, 8, 9]]
    settings = SamplerSettings(max_steps=2, early_stop=False)
    state = make_state(length=5, pins={4: 42})
    committed = sampler.run(state, build_chain(settings), constant(peaked([5, 6, 7, 8, 9])))
    assert committed.tolist() == [[5, 6, 7, 8, 42]]
    # a pinned EOS ends the text: everything after it is pad whatever the model says
    state = make_state(length=5, pins={2: EOS})
    committed = sampler.run(state, build_chain(settings), constant(peaked([5, 6, 7, 8, 9])))
    assert committed.tolist() == [[5, 6, EOS, PAD, PAD]]


def test_seeded_runs_are_reproducible():
    settings = SamplerSettings(max_steps=5, early_stop=False)

    def trajectory(seed):
        g = torch.Generator().manual_seed(99)  # the denoiser's own noise is fixed

        def denoiser(canvas, self_cond):
            return torch.randn(canvas.shape[0], canvas.shape[1], V, generator=g) + canvas[..., None] % 3

        state = make_state(length=16, batch=2, seed=seed)
        steps = []
        committed = sampler.run(
            state, build_chain(settings), denoiser, on_step=lambda s: steps.append(s.canvas.clone())
        )
        return committed, torch.stack(steps)

    a, b, c = trajectory(1), trajectory(1), trajectory(2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def test_cancel_is_polled_between_steps():
    settings = SamplerSettings(max_steps=10, early_stop=False)
    state = make_state(length=4)
    calls = []
    with pytest.raises(FillCancelled):
        sampler.run(
            state,
            build_chain(settings),
            constant(torch.randn(1, 4, V)),
            cancel=lambda: len(calls) >= 3,
            on_step=lambda s: calls.append(s.step),
        )
    assert calls == [1, 2, 3]


# --- the chain ----------------------------------------------------------------------------------


def test_the_chain_is_built_from_the_settings():
    names = [step.name for step in build_chain(SamplerSettings())]
    assert names == [
        "temperature",
        "mask_logits",
        "sample",
        "pins",
        "entropy_bound",
        "renoise",
        "self_conditioning",
        "stable_and_confident",
        "eos_confident",
        "max_steps",
    ]
    off = SamplerSettings(window=3, self_conditioning=False, early_stop=False)
    names = [step.name for step in build_chain(off)]
    assert names == ["temperature", "mask_logits", "sample", "pins", "order_window", "entropy_bound", "renoise",
                     "max_steps"]  # fmt: skip


def test_steps_that_edit_the_logits_come_first():
    with pytest.raises(ValueError, match="first"):
        Chain([steps.Sample(), steps.MaskLogits()])
    chain = build_chain(SamplerSettings())
    assert [s.name for s in chain.logit_steps] == ["temperature", "mask_logits"]


def test_a_step_never_edits_the_denoisers_logits_and_keeps_its_own():
    """A backend may hand out a buffer its next pass overwrites: the chain scales and masks a copy, and the
    state keeps that copy (self-conditioning reads it at the next pass), whether or not a step edited."""
    banned = torch.zeros(V, dtype=torch.bool)
    banned[[1, 4]] = True
    for settings in (SamplerSettings(max_steps=4, t_min=0.5, t_max=1.0), SamplerSettings(max_steps=1)):
        state = make_state(length=3, banned=banned)
        logits = torch.randn(1, 3, V, generator=torch.Generator().manual_seed(3))
        given = logits.clone()
        sampler.denoise_step(state, build_chain(settings), logits)
        assert torch.equal(logits, given)
        assert state.logits is not logits and state.owns_logits
        want = given / state.temperature
        want[..., [1, 4]] = -float("inf")
        assert torch.equal(state.logits, want)
        logits.fill_(7.0)  # the backend's next pass
        assert torch.equal(state.self_cond, want)


def test_a_chain_forgets_its_memory_on_a_new_canvas():
    """The stable rule remembers argmax canvases; a chain reused on a fresh state starts from nothing (or
    from the text a warm start seeds), so a canvas never counts as stable against another one's."""
    settings = SamplerSettings(max_steps=10)
    chain = build_chain(settings)
    tokens = [5, 6, 7, 8]  # no EOS: only the stable rule can stop
    for _ in range(2):
        state = make_state(length=4)
        sampler.run(state, chain, constant(peaked(tokens)))
        assert (state.step, state.stop_reason) == (2, ["stable"])
    warm = make_state(length=4, init_ids=torch.tensor(tokens), init_mask=torch.ones(4, dtype=torch.bool))
    sampler.run(warm, chain, constant(peaked(tokens)))
    assert (warm.step, warm.stop_reason) == (1, ["stable"])


def test_each_step_derives_one_distribution_and_pins_are_forced_in_what_it_derives():
    settings = SamplerSettings(max_steps=3, early_stop=False)
    seen = []

    class Probe(steps.Step):
        name = "probe"

        def apply(self, state) -> None:
            seen.append((state.dist, state.argmax, state.entropy, state.dist.probs))

    chain = Chain([*build_chain(settings).steps, Probe()])
    state = make_state(length=4, pins={2: 9})
    sampler.denoise_step(state, chain, peaked([5, 6, 7, 8], scale=1.0))
    dist, argmax, entropy, probs = seen[0]
    assert state.dist is dist and state.argmax is argmax and state.entropy is entropy  # each computed once
    assert probs is dist.probs
    assert argmax.tolist() == [[5, 6, 9, 8]] and dist.mode.tolist() == [[5, 6, 7, 8]]
    assert entropy[0, 2].item() == 0.0 and entropy[0, 0].item() > 0.1
    sampler.denoise_step(state, chain, peaked([5, 6, 7, 8], scale=1.0))
    assert seen[1][0] is not dist and state.dist is seen[1][0]  # the next step derives its own
