"""Every sampler rule against synthetic logits (no model): each test fails if its rule is wrong."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from dfim.engine.api import FillCancelled, SamplerSettings
from dfim.engine.inference import sampler

V = 50  # vocab of the synthetic denoisers
EOS, PAD = 1, 0


def make_state(length=8, batch=1, pins=None, seed=0, settings=None, **kw):
    settings = settings or SamplerSettings()
    pinned = torch.zeros(length, dtype=torch.bool)
    pin_ids = torch.zeros(length, dtype=torch.long)
    for position, token in (pins or {}).items():
        pinned[position] = True
        pin_ids[position] = token
    return sampler.new_state(
        batch,
        pinned,
        pin_ids,
        vocab_size=V,
        eos_id=EOS,
        pad_id=PAD,
        settings=settings,
        generator=torch.Generator().manual_seed(seed),
        **kw,
    )


def peaked(tokens, batch=1, scale=100.0):
    """Logits that put (almost) all mass on `tokens` (one per position)."""
    logits = torch.zeros(batch, len(tokens), V)
    logits[:, torch.arange(len(tokens)), torch.tensor(tokens)] = scale
    return logits


def constant(logits):
    return lambda canvas, self_cond: logits.clone()


# --- temperature --------------------------------------------------------------------------------


def test_temperature_schedule_values():
    # k = N..1 -> t_max at the first step, t_min + (t_max - t_min)/N at the last.
    assert sampler.temperature_at(1, 4, 0.4, 0.8) == pytest.approx(0.8)
    assert sampler.temperature_at(2, 4, 0.4, 0.8) == pytest.approx(0.7)
    assert sampler.temperature_at(4, 4, 0.4, 0.8) == pytest.approx(0.5)
    assert sampler.temperature_at(48, 48, 0.4, 0.8) == pytest.approx(0.4 + 0.4 / 48)


def test_temperature_step_scales_the_logits():
    settings = SamplerSettings(max_steps=4, t_min=0.4, t_max=0.8)
    state = make_state(length=3, settings=settings)
    logits = torch.randn(1, 3, V)
    temps = []
    for _ in range(4):
        sampler.denoise_step(state, settings, logits, chain=(sampler.temperature,))
        assert torch.allclose(state.logits, logits / state.temperature)
        temps.append(state.temperature)
    assert temps == pytest.approx([0.8, 0.7, 0.6, 0.5])


# --- entropy-bound acceptance -------------------------------------------------------------------


def test_entropy_bound_accepts_while_cumsum_minus_own_is_within_bound():
    h = torch.tensor([[0.01, 0.02, 0.05, 0.5, 0.03]])
    # ascending 0.01, 0.02, 0.03, 0.05, 0.5 -> cumsum - H = 0, 0.01, 0.03, 0.06, 0.11
    accepted = sampler.accept_by_entropy(h, torch.zeros(5, dtype=torch.bool), 0.1)
    assert accepted.tolist() == [[True, True, True, False, True]]
    # a smaller bound stops earlier: 0.06 > 0.05 rejects the fourth-lowest (0.05)
    accepted = sampler.accept_by_entropy(h, torch.zeros(5, dtype=torch.bool), 0.05)
    assert accepted.tolist() == [[True, True, False, False, True]]


def test_entropy_bound_accepts_at_least_one():
    h = torch.tensor([[3.0, 2.0, 4.0]])
    accepted = sampler.accept_by_entropy(h, torch.zeros(3, dtype=torch.bool), -1.0)
    assert accepted.tolist() == [[False, True, False]]  # the lowest entropy, even over the bound


def test_pins_are_accepted_and_do_not_spend_the_bound():
    h = torch.tensor([[0.09, 5.0, 0.05, 0.2]])
    pinned = torch.tensor([False, True, False, False])
    accepted = sampler.accept_by_entropy(h, pinned, 0.1)
    # free ascending 0.05, 0.09, 0.2 -> 0, 0.05, 0.14: the two lowest free plus the pin
    assert accepted.tolist() == [[True, True, True, False]]


def test_order_window_limits_acceptance_to_the_left_edge_plus_window():
    settings = SamplerSettings(window=2)
    state = make_state(length=8, pins={3: 7}, settings=settings)
    # Step 1: nothing accepted yet, so positions 0 and 1 are eligible (pins are accepted anyway).
    sampler.order_window(state, settings)
    assert state.eligible.tolist() == [[True, True, False, False, False, False, False, False]]
    state.entropy = torch.full((1, 8), 0.001)  # everything certain: only the window may be kept
    sampler.entropy_bound(state, settings)
    assert state.accepted.tolist() == [[True, True, False, True, False, False, False, False]]
    # Step 2: 0-1 kept and 3 pinned, so the first open position is 2: positions up to 3 are eligible.
    sampler.order_window(state, settings)
    assert state.eligible[0, :4].all() and not state.eligible[0, 4:].any()
    # The released sampler (window 0) leaves every position eligible.
    sampler.order_window(state, SamplerSettings())
    assert state.eligible is None


def test_order_window_still_accepts_one_position_and_finishes():
    """Over a whole run the window crawls left to right and the canvas still settles and stops."""
    settings = SamplerSettings(window=1, max_steps=40)
    state = make_state(length=6, settings=settings)
    tokens = [5, 6, 7, EOS, PAD, PAD]
    canvas = sampler.run(state, settings, constant(peaked(tokens)))
    assert canvas[0].tolist() == tokens
    assert state.stop_reason[0] in ("stable", "eos_confident") and int(state.steps[0]) < 40
    # Window 0 accepts all of these certain positions at once and stops on step 1 (eos_confident);
    # window 1 accepts one new position a step, so only the argmax canvas' stability stops it.
    assert int(state.steps[0]) == 2 and state.stop_reason[0] == "stable"


def test_order_window_keeps_warm_start_tokens_eligible():
    """A rewrite's old text must survive the window: seeded positions stay eligible until renoised."""
    settings = SamplerSettings(window=1)
    old = torch.tensor([5, 6, 7, 8, 9, 10, 11, 12])
    state = make_state(
        length=8, settings=settings, init_ids=old, init_mask=torch.ones(8, dtype=torch.bool), init_noise=0.0
    )
    chain = (sampler.sample, sampler.token_entropy, sampler.pins, sampler.order_window,
             sampler.entropy_bound, sampler.renoise)  # fmt: skip
    sampler.denoise_step(state, settings, peaked(old.tolist()), chain)
    assert state.accepted.all() and torch.equal(state.canvas[0], old)
    # A seeded position the entropy bound rejects is renoised and from then on waits for the window.
    state.accepted[0, 6] = False
    sampler.renoise(state, settings)
    assert not bool(state.seeded[0, 6]) and bool(state.seeded[0, 7])
    sampler.order_window(state, settings)
    assert state.eligible[0].tolist() == [True] * 8  # 0-5 accepted, 6 the first open one, 7 seeded
    state.seeded[0, 7] = False
    sampler.order_window(state, settings)
    assert state.eligible[0].tolist() == [True] * 7 + [False]


def test_entropy_step_measures_the_processed_distribution():
    settings = SamplerSettings(max_steps=1, t_min=0.5, t_max=1.0)
    state = make_state(length=2, settings=settings)
    logits = torch.zeros(1, 2, V)
    logits[0, 0, 3] = 100.0  # position 0 certain, position 1 uniform
    sampler.denoise_step(state, settings, logits)
    assert state.entropy[0, 0].item() == pytest.approx(0.0, abs=1e-6)
    assert state.entropy[0, 1].item() == pytest.approx(math.log(V), rel=1e-5)
    assert torch.allclose(sampler.confidence(state), torch.exp(-state.entropy))


# --- pins and renoise ---------------------------------------------------------------------------


def test_pins_hold_their_token_at_every_step_over_many_seeds():
    pins = {0: 7, 3: 9, 5: 11}
    settings = SamplerSettings(max_steps=6, early_stop=False)
    for seed in range(100):
        g = torch.Generator().manual_seed(10_000 + seed)

        def denoiser(canvas, self_cond, g=g):
            logits = torch.randn(canvas.shape[0], canvas.shape[1], V, generator=g) * 3
            logits[:, :, [7, 9, 11]] = -50.0  # the model never wants the pinned tokens
            return logits

        state = make_state(length=8, batch=2, pins=pins, seed=seed, settings=settings)
        seen = []
        committed = sampler.run(state, settings, denoiser, on_step=lambda s, seen=seen: seen.append(s.canvas))
        for canvas in [state.canvas, *seen]:
            assert canvas[:, [0, 3, 5]].tolist() == [[7, 9, 11]] * 2
        assert committed[:, [0, 3, 5]].tolist() == [[7, 9, 11]] * 2
        assert state.accepted[:, [0, 3, 5]].all()


def test_renoise_replaces_only_non_accepted_positions():
    settings = SamplerSettings(max_steps=1)
    length = 64
    logits = torch.full((1, length, V), -1e4)
    logits[0, :32, 5] = 100.0  # the first half is certain -> accepted
    logits[0, 32:, 2:4] = 0.0  # the second half is a coin flip between tokens 2 and 3 -> rejected
    state = make_state(length=length, settings=settings)
    sampler.denoise_step(state, settings, logits)
    # all certain positions plus the first coin flip (cumsum - H = 0 there); ln 2 > 0.1 stops the rest
    assert state.accepted[0, :32].all() and state.accepted[0].sum() == 33
    assert (state.canvas[0, :32] == 5).all()
    kept = state.canvas[0][state.accepted[0]]
    assert torch.equal(kept, state.sampled[0][state.accepted[0]])
    # the rejected ones were drawn from {2, 3} but must now hold fresh uniform noise over the vocabulary
    rejected = state.canvas[0][~state.accepted[0]]
    assert ((rejected != 2) & (rejected != 3)).float().mean() > 0.8
    assert len(set(rejected.tolist())) > 10


def test_warm_start_keeps_part_of_the_old_tokens():
    length = 200
    init = torch.full((length,), 13)
    mask = torch.ones(length, dtype=torch.bool)
    state = make_state(length=length, init_ids=init, init_mask=mask, init_noise=0.5)
    kept = (state.canvas[0] == 13).float().mean().item()
    assert 0.35 < kept < 0.65  # about half renoised (noise hits 13 only 1/V of the time)
    state = make_state(length=length, init_ids=init, init_mask=mask, init_noise=0.0)
    assert (state.canvas[0] == 13).all()


# --- masks --------------------------------------------------------------------------------------


def test_banned_tokens_and_inner_hole_ends_are_never_sampled():
    settings = SamplerSettings(max_steps=4, early_stop=False)
    banned = torch.zeros(V, dtype=torch.bool)
    banned[[2, 4, 6]] = True
    no_end = torch.tensor([True, True, False, False])
    allowed = torch.zeros(V, dtype=torch.bool)
    allowed[[20, 21]] = True
    logits = torch.zeros(1, 4, V)
    logits[:, :, [EOS, PAD, 2, 4, 6]] = 50.0  # the model loves exactly the forbidden tokens
    for seed in range(20):
        state = make_state(
            length=4, seed=seed, banned=banned, no_end=no_end, allowed_at={1: allowed}, settings=settings
        )
        sampler.run(state, settings, constant(logits))
        assert not torch.isin(state.sampled, torch.tensor([2, 4, 6])).any()
        assert not torch.isin(state.sampled[:, :2], torch.tensor([EOS, PAD])).any()
        assert state.sampled[0, 1].item() in (20, 21) and state.argmax[0, 1].item() in (20, 21)
        assert state.argmax[0, 2].item() in (EOS, PAD)  # where ends are allowed, they win


# --- self-conditioning --------------------------------------------------------------------------


def test_self_conditioning_feeds_the_previous_temperature_scaled_logits():
    settings = SamplerSettings(max_steps=3, early_stop=False, t_min=0.4, t_max=0.8)
    received = []
    produced = [torch.randn(1, 4, V) for _ in range(3)]

    def denoiser(canvas, self_cond):
        received.append(None if self_cond is None else self_cond.clone())
        return produced[len(received) - 1].clone()

    state = make_state(length=4, settings=settings)
    sampler.run(state, settings, denoiser)
    assert received[0] is None  # nothing on the first step
    assert torch.allclose(received[1], produced[0] / 0.8)
    assert torch.allclose(received[2], produced[1] / sampler.temperature_at(2, 3, 0.4, 0.8))

    received.clear()
    off = replace(settings, self_conditioning=False)
    sampler.run(make_state(length=4, settings=off), off, denoiser)
    assert received == [None, None, None]


# --- stopping -----------------------------------------------------------------------------------


def test_stable_and_confident_stops_after_stability_threshold_repeats():
    tokens = [5, 6, 7, 8]  # no EOS: only the stable rule can stop
    for threshold in (1, 3):
        settings = SamplerSettings(max_steps=20, stability_threshold=threshold)
        state = make_state(length=4, settings=settings)
        sampler.run(state, settings, constant(peaked(tokens)))
        assert state.step == threshold + 1
        assert state.stop_reason == ["stable"]


def test_unstable_or_unsure_canvas_runs_to_max_steps():
    settings = SamplerSettings(max_steps=7)
    # confident but the argmax changes every step
    calls = []

    def flipping(canvas, self_cond):
        calls.append(1)
        return peaked([5 + len(calls) % 2] * 4)

    state = make_state(length=4, settings=settings)
    sampler.run(state, settings, flipping)
    assert (state.step, state.stop_reason) == (7, ["max_steps"])
    # stable but not confident: mean entropy well above 0.005
    state = make_state(length=4, settings=settings)
    sampler.run(state, settings, constant(peaked([5, 6, 7, 8], scale=3.0)))
    assert (state.step, state.stop_reason) == (7, ["max_steps"])


def test_eos_confident_stops_although_the_tail_is_noise():
    settings = SamplerSettings(max_steps=10)
    logits = torch.zeros(1, 6, V)  # positions 3.. uniform: the stable rule can never fire
    logits[0, 0, 9] = logits[0, 1, 10] = logits[0, 2, EOS] = 100.0
    state = make_state(length=6, settings=settings)
    committed = sampler.run(state, settings, constant(logits))
    assert (state.step, state.stop_reason) == (1, ["eos_confident"])
    assert committed.tolist() == [[9, 10, EOS, PAD, PAD, PAD]]
    # one unsure token before the EOS: no early stop
    logits[0, 1] = 0.0
    logits[0, 1, 10] = logits[0, 1, 11] = 100.0
    state = make_state(length=6, settings=settings)
    sampler.run(state, settings, constant(logits))
    assert state.stop_reason == ["max_steps"]


def test_a_settled_stop_token_ends_the_fill_like_eos():
    # A single-line fill: token 12 holds a newline; the canvas after it is noise the stop cuts off.
    settings = SamplerSettings(max_steps=10)
    logits = torch.zeros(1, 6, V)
    logits[0, 0, 9] = logits[0, 1, 12] = 100.0  # "text", "\n", then uniform noise
    stop_tokens = torch.zeros(V, dtype=torch.bool)
    stop_tokens[12] = True
    state = make_state(length=6, settings=settings, stop_tokens=stop_tokens)
    sampler.run(state, settings, constant(logits))
    assert (state.step, state.stop_reason) == (1, ["stop_confident"])
    # without stop tokens the same canvas never settles
    state = make_state(length=6, settings=settings)
    sampler.run(state, settings, constant(logits))
    assert state.stop_reason == ["max_steps"]
    # an unsure token before the stop token: no early stop
    logits[0, 0, 10] = 100.0
    state = make_state(length=6, settings=settings, stop_tokens=stop_tokens)
    sampler.run(state, settings, constant(logits))
    assert state.stop_reason == ["max_steps"]
    # an EOS before the stop token still reports eos_confident
    logits[0, 0] = 0.0
    logits[0, 0, EOS] = 100.0
    state = make_state(length=6, settings=settings, stop_tokens=stop_tokens)
    sampler.run(state, settings, constant(logits))
    assert state.stop_reason == ["eos_confident"]


def test_stable_ignores_what_a_stop_token_or_eos_cuts_off():
    # "text" "\n" then a tail the single-line cut drops; no acceptance rule, so only `stable` can stop.
    chain = (
        sampler.mask_logits,
        sampler.temperature,
        sampler.sample,
        sampler.token_entropy,
        sampler.stable_and_confident,
        sampler.max_steps,
    )
    settings = SamplerSettings(max_steps=8)
    stop_tokens = torch.zeros(V, dtype=torch.bool)
    stop_tokens[12] = True
    calls = []

    def churning_tail(canvas, self_cond):  # the tail's argmax changes every step
        calls.append(1)
        return peaked([9, 12, 20 + len(calls) % 5, 30, 31, 32])

    def doubtful_tail(canvas, self_cond):  # the tail's argmax is stable, its entropy high
        logits = peaked([9, 12, 0, 0, 0, 0])
        logits[0, 2:] = 0.0
        return logits

    def churning_after_eos(canvas, self_cond):  # no stop strings: an EOS cuts the text as well
        calls.append(1)
        return peaked([9, EOS, 20 + len(calls) % 5, 30, 31, 32])

    for denoiser in (churning_tail, doubtful_tail):
        state = make_state(length=6, settings=settings, stop_tokens=stop_tokens)
        sampler.run(state, settings, denoiser, chain=chain)
        assert (state.step, state.stop_reason) == (2, ["stable"])
        state = make_state(length=6, settings=settings)  # no stop strings: token 12 is text, read on
        sampler.run(state, settings, denoiser, chain=chain)
        assert (state.step, state.stop_reason) == (8, ["max_steps"])
    state = make_state(length=6, settings=settings)
    sampler.run(state, settings, churning_after_eos, chain=chain)
    assert (state.step, state.stop_reason) == (2, ["stable"])


def test_which_newline_run_ends_a_line_does_not_keep_it_running():
    """Tokens 12 ("\n") and 13 ("\n\n\n") both begin with the stop string: the fill is cut before either,
    so a position split between them (or flipping from one to the other) is settled for the stop rules.
    A split between a stop token and text (" False" against "\n") is not."""
    settings = SamplerSettings(max_steps=8)
    stop_tokens = torch.zeros(V, dtype=torch.bool)
    stop_tokens[12] = stop_tokens[13] = stop_tokens[14] = True  # 14: "x\n", text before its newline
    starts = stop_tokens.clone()
    starts[14] = False

    def split(a: int, b: int):
        def denoiser(canvas, self_cond):
            logits = peaked([9, a, EOS, PAD, PAD, PAD])
            logits[0, 1, a] = logits[0, 1, b] = 20.0  # half and half
            return logits

        return denoiser

    def flipping(canvas, self_cond):
        calls.append(1)
        return peaked([9, 12 if len(calls) % 2 else 13, EOS, PAD, PAD, PAD])

    def run(denoiser, stop_starts, chain=sampler.DEFAULT_CHAIN):
        state = make_state(length=6, settings=settings, stop_tokens=stop_tokens, stop_starts=stop_starts)
        sampler.run(state, settings, denoiser, chain=chain)
        return state.step, state.stop_reason[0]

    assert run(split(12, 13), starts) == (1, "stop_confident")
    assert run(split(12, 13), None) == (8, "max_steps")  # without the class the doubt stays
    assert run(split(12, 20), starts) == (8, "max_steps")  # "\n" or more text: the doubt matters
    assert run(split(14, 13), starts) == (8, "max_steps")  # "x\n" writes an x: it is not "ends here"
    # stability alone (no eos_confident): a canvas that flips between the two newline runs is stable
    chain = tuple(step for step in sampler.DEFAULT_CHAIN if step is not sampler.eos_confident)
    calls: list[int] = []
    assert run(flipping, starts, chain) == (2, "stable")
    calls = []
    assert run(flipping, None, chain) == (8, "max_steps")


def test_early_stop_false_runs_max_steps():
    settings = SamplerSettings(max_steps=9, early_stop=False)
    logits = peaked([9, 10, EOS, PAD])
    state = make_state(length=4, settings=settings)
    sampler.run(state, settings, constant(logits))
    assert (state.step, state.stop_reason, state.steps.tolist()) == (9, ["max_steps"], [9])


def test_finished_rows_are_frozen_while_others_continue():
    settings = SamplerSettings(max_steps=6)
    logits = peaked([5, 6, 7, 8], batch=2)
    logits[1] = torch.randn(4, V)  # row 1 never gets confident
    state = make_state(length=4, batch=2, settings=settings)
    snapshots = []
    rows_seen = []

    def denoiser(canvas, self_cond):  # once row 0 has finished, the decoder is asked for row 1 only
        rows_seen.append(canvas.shape[0])
        assert self_cond is None or self_cond.shape[0] == canvas.shape[0]
        return logits[-canvas.shape[0] :].clone()

    sampler.run(state, settings, denoiser, on_step=lambda s: snapshots.append(s.canvas[0].clone()))
    assert state.stop_reason == ["stable", "max_steps"]
    assert state.steps.tolist() == [2, 6]
    assert rows_seen == [2, 2, 1, 1, 1, 1]  # a finished candidate costs no decoder pass
    for canvas in snapshots[2:]:
        assert torch.equal(canvas, snapshots[1])
    assert state.argmax[0].tolist() == [5, 6, 7, 8]


def test_commit_pads_after_the_first_eos_and_forces_pins():
    ids = torch.tensor([[5, EOS, 7, EOS, 8], [5, 6, 7, 8, 9]])
    assert sampler.pad_after_eos(ids, EOS, PAD).tolist() == [[5, EOS, PAD, PAD, PAD], [5, 6, 7, 8, 9]]
    settings = SamplerSettings(max_steps=2, early_stop=False)
    state = make_state(length=5, pins={4: 42}, settings=settings)
    committed = sampler.run(state, settings, constant(peaked([5, 6, 7, 8, 9])))
    assert committed.tolist() == [[5, 6, 7, 8, 42]]
    # a pinned EOS ends the text: everything after it is pad whatever the model says
    state = make_state(length=5, pins={2: EOS}, settings=settings)
    committed = sampler.run(state, settings, constant(peaked([5, 6, 7, 8, 9])))
    assert committed.tolist() == [[5, 6, EOS, PAD, PAD]]


# --- reproducibility and cancel -----------------------------------------------------------------


def test_seeded_runs_are_reproducible():
    settings = SamplerSettings(max_steps=5, early_stop=False)

    def trajectory(seed):
        g = torch.Generator().manual_seed(99)  # the denoiser's own noise is fixed

        def denoiser(canvas, self_cond):
            return torch.randn(canvas.shape[0], canvas.shape[1], V, generator=g) + canvas[..., None] % 3

        state = make_state(length=16, batch=2, seed=seed, settings=settings)
        steps = []
        committed = sampler.run(state, settings, denoiser, on_step=lambda s: steps.append(s.canvas.clone()))
        return committed, torch.stack(steps)

    a, b, c = trajectory(1), trajectory(1), trajectory(2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def test_cancel_is_polled_between_steps():
    settings = SamplerSettings(max_steps=10, early_stop=False)
    state = make_state(length=4, settings=settings)
    calls = []
    with pytest.raises(FillCancelled):
        sampler.run(
            state,
            settings,
            constant(torch.randn(1, 4, V)),
            cancel=lambda: len(calls) >= 3,
            on_step=lambda s: calls.append(s.step),
        )
    assert calls == [1, 2, 3]


def test_sample_draws_from_the_processed_distribution():
    settings = SamplerSettings(max_steps=1, t_min=1.0, t_max=1.0)
    length = 4000
    logits = torch.full((1, length, V), float("-inf"))
    logits[0, :, 10], logits[0, :, 11], logits[0, :, 12] = math.log(0.7), math.log(0.2), math.log(0.1)
    state = make_state(length=length, settings=settings)
    sampler.denoise_step(state, settings, logits, chain=(sampler.temperature, sampler.sample))
    freq = torch.bincount(state.sampled[0], minlength=V)[10:13].float() / length
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)
    assert (state.argmax == 10).all()
