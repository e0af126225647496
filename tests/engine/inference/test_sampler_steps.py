"""Every rule of the denoising chain against synthetic logits (no model): each test fails if its rule is wrong."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from dfim.engine.api import SamplerSettings
from dfim.engine.inference import sampler
from dfim.engine.inference import sampler_steps as steps
from dfim.engine.inference.sampler_steps import Chain, build_chain
from tests.engine.inference.sampler_helpers import EOS, PAD, V, constant, make_state, peaked

# --- temperature ----------------------------------------------------------------------------------


def test_temperature_schedule_values():
    # k = N..1 -> t_max at the first step, t_min + (t_max - t_min)/N at the last.
    assert steps.temperature_at(1, 4, 0.4, 0.8) == pytest.approx(0.8)
    assert steps.temperature_at(2, 4, 0.4, 0.8) == pytest.approx(0.7)
    assert steps.temperature_at(4, 4, 0.4, 0.8) == pytest.approx(0.5)
    assert steps.temperature_at(48, 48, 0.4, 0.8) == pytest.approx(0.4 + 0.4 / 48)


def test_temperature_step_scales_the_logits():
    settings = SamplerSettings(max_steps=4, t_min=0.4, t_max=0.8)
    state = make_state(length=3)
    logits = torch.randn(1, 3, V)
    chain = Chain([steps.Temperature(settings.t_min, settings.t_max, settings.max_steps)])
    temps = []
    for _ in range(4):
        sampler.denoise_step(state, chain, logits)
        assert torch.allclose(state.logits, logits / state.temperature)
        temps.append(state.temperature)
    assert temps == pytest.approx([0.8, 0.7, 0.6, 0.5])


# --- entropy-bound acceptance and the window ------------------------------------------------------


def test_entropy_bound_accepts_while_cumsum_minus_own_is_within_bound():
    h = torch.tensor([[0.01, 0.02, 0.05, 0.5, 0.03]])
    # ascending 0.01, 0.02, 0.03, 0.05, 0.5 -> cumsum - H = 0, 0.01, 0.03, 0.06, 0.11
    accepted = steps.accept_by_entropy(h, torch.zeros(5, dtype=torch.bool), 0.1)
    assert accepted.tolist() == [[True, True, True, False, True]]
    # a smaller bound stops earlier: 0.06 > 0.05 rejects the fourth-lowest (0.05)
    accepted = steps.accept_by_entropy(h, torch.zeros(5, dtype=torch.bool), 0.05)
    assert accepted.tolist() == [[True, True, False, False, True]]


def test_entropy_bound_accepts_at_least_one():
    h = torch.tensor([[3.0, 2.0, 4.0]])
    accepted = steps.accept_by_entropy(h, torch.zeros(3, dtype=torch.bool), -1.0)
    assert accepted.tolist() == [[False, True, False]]  # the lowest entropy, even over the bound


def test_pins_are_accepted_and_do_not_spend_the_bound():
    h = torch.tensor([[0.09, 5.0, 0.05, 0.2]])
    pinned = torch.tensor([False, True, False, False])
    accepted = steps.accept_by_entropy(h, pinned, 0.1)
    # free ascending 0.05, 0.09, 0.2 -> 0, 0.05, 0.14: the two lowest free plus the pin
    assert accepted.tolist() == [[True, True, True, False]]


def test_order_window_limits_acceptance_to_the_left_edge_plus_window():
    settings = SamplerSettings(window=2)
    state = make_state(length=8, pins={3: 7})
    # Step 1: nothing accepted yet, so positions 0 and 1 are eligible (pins are accepted anyway).
    steps.OrderWindow(2).apply(state)
    assert state.eligible.tolist() == [[True, True, False, False, False, False, False, False]]
    state.entropy = torch.full((1, 8), 0.001)  # everything certain: only the window may be kept
    steps.EntropyBound(settings.entropy_bound).apply(state)
    assert state.accepted.tolist() == [[True, True, False, True, False, False, False, False]]
    # Step 2: 0-1 kept and 3 pinned, so the first open position is 2: positions up to 3 are eligible.
    steps.OrderWindow(2).apply(state)
    assert state.eligible[0, :4].all() and not state.eligible[0, 4:].any()
    # The released sampler (window 0) leaves every position eligible.
    steps.OrderWindow(SamplerSettings().window).apply(state)
    assert state.eligible is None


def test_order_window_still_accepts_one_position_and_finishes():
    """Over a whole run the window crawls left to right and the canvas still settles and stops."""
    settings = SamplerSettings(window=1, max_steps=40)
    state = make_state(length=6)
    tokens = [5, 6, 7, EOS, PAD, PAD]
    canvas = sampler.run(state, build_chain(settings), constant(peaked(tokens)))
    assert canvas[0].tolist() == tokens
    assert state.stop_reason[0] in ("stable", "eos_confident") and int(state.steps[0]) < 40
    # Window 0 accepts all of these certain positions at once and stops on step 1 (eos_confident);
    # window 1 accepts one new position a step, so only the argmax canvas' stability stops it.
    assert int(state.steps[0]) == 2 and state.stop_reason[0] == "stable"


def test_order_window_keeps_warm_start_tokens_eligible():
    """A rewrite's old text must survive the window: seeded positions stay eligible until renoised."""
    settings = SamplerSettings(window=1)
    old = torch.tensor([5, 6, 7, 8, 9, 10, 11, 12])
    state = make_state(length=8, init_ids=old, init_mask=torch.ones(8, dtype=torch.bool), init_noise=0.0)
    chain = Chain(
        [
            steps.Sample(),
            steps.Pins(),
            steps.OrderWindow(settings.window),
            steps.EntropyBound(0.1),
            steps.Renoise(),
        ]
    )
    sampler.denoise_step(state, chain, peaked(old.tolist()))
    assert state.accepted.all() and torch.equal(state.canvas[0], old)
    # A seeded position the entropy bound rejects is renoised and from then on waits for the window.
    state.accepted[0, 6] = False
    steps.Renoise().apply(state)
    assert not bool(state.seeded[0, 6]) and bool(state.seeded[0, 7])
    steps.OrderWindow(settings.window).apply(state)
    assert state.eligible[0].tolist() == [True] * 8  # 0-5 accepted, 6 the first open one, 7 seeded
    state.seeded[0, 7] = False
    steps.OrderWindow(settings.window).apply(state)
    assert state.eligible[0].tolist() == [True] * 7 + [False]


# --- renoise --------------------------------------------------------------------------------------


def test_renoise_replaces_only_non_accepted_positions():
    settings = SamplerSettings(max_steps=1)
    length = 64
    logits = torch.full((1, length, V), -1e4)
    logits[0, :32, 5] = 100.0  # the first half is certain -> accepted
    logits[0, 32:, 2:4] = 0.0  # the second half is a coin flip between tokens 2 and 3 -> rejected
    state = make_state(length=length)
    sampler.denoise_step(state, build_chain(settings), logits)
    # all certain positions plus the first coin flip (cumsum - H = 0 there); ln 2 > 0.1 stops the rest
    assert state.accepted[0, :32].all() and state.accepted[0].sum() == 33
    assert (state.canvas[0, :32] == 5).all()
    kept = state.canvas[0][state.accepted[0]]
    assert torch.equal(kept, state.sampled[0][state.accepted[0]])
    # the rejected ones were drawn from {2, 3} but must now hold fresh uniform noise over the vocabulary
    rejected = state.canvas[0][~state.accepted[0]]
    assert ((rejected != 2) & (rejected != 3)).float().mean() > 0.8
    assert len(set(rejected.tolist())) > 10


# --- masks ----------------------------------------------------------------------------------------


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
        state = make_state(length=4, seed=seed, banned=banned, no_end=no_end, allowed_at={1: allowed})
        sampler.run(state, build_chain(settings), constant(logits))
        assert not torch.isin(state.sampled, torch.tensor([2, 4, 6])).any()
        assert not torch.isin(state.sampled[:, :2], torch.tensor([EOS, PAD])).any()
        assert state.sampled[0, 1].item() in (20, 21) and state.argmax[0, 1].item() in (20, 21)
        assert state.argmax[0, 2].item() in (EOS, PAD)  # where ends are allowed, they win


# --- sampling and self-conditioning ---------------------------------------------------------------


def test_sample_draws_from_the_processed_distribution():
    settings = SamplerSettings(max_steps=1, t_min=1.0, t_max=1.0)
    length = 4000
    logits = torch.full((1, length, V), float("-inf"))
    logits[0, :, 10], logits[0, :, 11], logits[0, :, 12] = math.log(0.7), math.log(0.2), math.log(0.1)
    state = make_state(length=length)
    chain = Chain([steps.Temperature(settings.t_min, settings.t_max, settings.max_steps), steps.Sample()])
    sampler.denoise_step(state, chain, logits)
    freq = torch.bincount(state.sampled[0], minlength=V)[10:13].float() / length
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)
    assert (state.argmax == 10).all()


def test_self_conditioning_feeds_the_previous_temperature_scaled_logits():
    settings = SamplerSettings(max_steps=3, early_stop=False, t_min=0.4, t_max=0.8)
    received = []
    produced = [torch.randn(1, 4, V) for _ in range(3)]

    def denoiser(canvas, self_cond):
        received.append(None if self_cond is None else self_cond.clone())
        return produced[len(received) - 1].clone()

    state = make_state(length=4)
    sampler.run(state, build_chain(settings), denoiser)
    assert received[0] is None  # nothing on the first step
    assert torch.allclose(received[1], produced[0] / 0.8)
    assert torch.allclose(received[2], produced[1] / steps.temperature_at(2, 3, 0.4, 0.8))

    received.clear()
    off = replace(settings, self_conditioning=False)
    sampler.run(make_state(length=4), build_chain(off), denoiser)
    assert received == [None, None, None]


# --- stopping -------------------------------------------------------------------------------------


def test_stable_and_confident_stops_after_stability_threshold_repeats():
    tokens = [5, 6, 7, 8]  # no EOS: only the stable rule can stop
    for threshold in (1, 3):
        settings = SamplerSettings(max_steps=20, stability_threshold=threshold)
        state = make_state(length=4)
        sampler.run(state, build_chain(settings), constant(peaked(tokens)))
        assert state.step == threshold + 1
        assert state.stop_reason == ["stable"]


def test_unstable_or_unsure_canvas_runs_to_max_steps():
    settings = SamplerSettings(max_steps=7)
    # confident but the argmax changes every step
    calls = []

    def flipping(canvas, self_cond):
        calls.append(1)
        return peaked([5 + len(calls) % 2] * 4)

    state = make_state(length=4)
    sampler.run(state, build_chain(settings), flipping)
    assert (state.step, state.stop_reason) == (7, ["max_steps"])
    # stable but not confident: mean entropy well above 0.005
    state = make_state(length=4)
    sampler.run(state, build_chain(settings), constant(peaked([5, 6, 7, 8], scale=3.0)))
    assert (state.step, state.stop_reason) == (7, ["max_steps"])


def test_eos_confident_stops_although_the_tail_is_noise():
    settings = SamplerSettings(max_steps=10)
    logits = torch.zeros(1, 6, V)  # positions 3.. uniform: the stable rule can never fire
    logits[0, 0, 9] = logits[0, 1, 10] = logits[0, 2, EOS] = 100.0
    state = make_state(length=6)
    committed = sampler.run(state, build_chain(settings), constant(logits))
    assert (state.step, state.stop_reason) == (1, ["eos_confident"])
    assert committed.tolist() == [[9, 10, EOS, PAD, PAD, PAD]]
    # one unsure token before the EOS: no early stop
    logits[0, 1] = 0.0
    logits[0, 1, 10] = logits[0, 1, 11] = 100.0
    state = make_state(length=6)
    sampler.run(state, build_chain(settings), constant(logits))
    assert state.stop_reason == ["max_steps"]


def test_a_settled_stop_token_ends_the_fill_like_eos():
    # A single-line fill: token 12 holds a newline; the canvas after it is noise the stop cuts off.
    settings = SamplerSettings(max_steps=10)
    logits = torch.zeros(1, 6, V)
    logits[0, 0, 9] = logits[0, 1, 12] = 100.0  # "text", "\n", then uniform noise
    stop_tokens = torch.zeros(V, dtype=torch.bool)
    stop_tokens[12] = True
    state = make_state(length=6, stop_tokens=stop_tokens)
    sampler.run(state, build_chain(settings), constant(logits))
    assert (state.step, state.stop_reason) == (1, ["stop_confident"])
    # without stop tokens the same canvas never settles
    state = make_state(length=6)
    sampler.run(state, build_chain(settings), constant(logits))
    assert state.stop_reason == ["max_steps"]
    # an unsure token before the stop token: no early stop
    logits[0, 0, 10] = 100.0
    state = make_state(length=6, stop_tokens=stop_tokens)
    sampler.run(state, build_chain(settings), constant(logits))
    assert state.stop_reason == ["max_steps"]
    # an EOS before the stop token still reports eos_confident
    logits[0, 0] = 0.0
    logits[0, 0, EOS] = 100.0
    state = make_state(length=6, stop_tokens=stop_tokens)
    sampler.run(state, build_chain(settings), constant(logits))
    assert state.stop_reason == ["eos_confident"]


def test_stable_ignores_what_a_stop_token_or_eos_cuts_off():
    # "text" "\n" then a tail the single-line cut drops; no acceptance rule, so only `stable` can stop.
    settings = SamplerSettings(max_steps=8)
    chain = [
        steps.MaskLogits(),
        steps.Temperature(settings.t_min, settings.t_max, settings.max_steps),
        steps.Sample(),
        steps.StableAndConfident(settings.stability_threshold, settings.confidence_threshold),
        steps.MaxSteps(settings.max_steps),
    ]
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
        state = make_state(length=6, stop_tokens=stop_tokens)
        sampler.run(state, Chain(chain), denoiser)
        assert (state.step, state.stop_reason) == (2, ["stable"])
        state = make_state(length=6)  # no stop strings: token 12 is text, read on
        sampler.run(state, Chain(chain), denoiser)
        assert (state.step, state.stop_reason) == (8, ["max_steps"])
    state = make_state(length=6)
    sampler.run(state, Chain(chain), churning_after_eos)
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

    def run(denoiser, stop_starts, chain=None):
        state = make_state(length=6, stop_tokens=stop_tokens, stop_starts=stop_starts)
        sampler.run(state, chain or build_chain(settings), denoiser)
        return state.step, state.stop_reason[0]

    assert run(split(12, 13), starts) == (1, "stop_confident")
    assert run(split(12, 13), None) == (8, "max_steps")  # without the class the doubt stays
    assert run(split(12, 20), starts) == (8, "max_steps")  # "\n" or more text: the doubt matters
    assert run(split(14, 13), starts) == (8, "max_steps")  # "x\n" writes an x: it is not "ends here"
    # stability alone (no eos_confident): a canvas that flips between the two newline runs is stable
    chain = Chain([step for step in build_chain(settings) if not isinstance(step, steps.EosConfident)])
    calls: list[int] = []
    assert run(flipping, starts, chain) == (2, "stable")
    calls = []
    assert run(flipping, None, chain) == (8, "max_steps")


def test_read_entropy_merges_the_ways_to_end_the_text_where_each_row_ends():
    """At a row's first end the doubt is whether the text ends (EOS or a newline-like stop token are one
    outcome); other positions keep the plain entropy, and so does a row whose end is not such a token."""
    newline = 7
    stops = torch.zeros(V, dtype=torch.bool)
    stops[newline] = True
    state = make_state(length=4, batch=2, stop_tokens=stops, stop_starts=stops)
    logits = torch.randn(2, 4, V, generator=torch.Generator().manual_seed(0))
    logits[0, 1, EOS] = logits[0, 1, newline] = 6.0  # row 0 ends at 1, split between EOS and a newline
    logits[0, 3, EOS] = 8.0  # a later end: past the first one, nothing reads it
    logits[1, :, 9] = 9.0  # row 1 never ends
    state.logits = logits
    state.derive()
    got = steps.read_entropy(state)
    plain = state.entropy
    p = torch.softmax(logits[0, 1], dim=-1)
    q = p[EOS] + p[newline]
    rest = torch.ones(V, dtype=torch.bool)
    rest[[EOS, newline]] = False
    want = -(p[rest] * p[rest].log()).sum() - q * q.log()
    assert torch.allclose(got[0, 1], want, atol=1e-5) and got[0, 1] < plain[0, 1] - 0.5
    others = torch.ones(2, 4, dtype=torch.bool)
    others[0, 1] = False
    assert torch.equal(got[others], plain[others])
    # a pinned end is certain: nothing to merge there
    state = make_state(length=4, batch=1, pins={1: newline}, stop_tokens=stops, stop_starts=stops)
    state.logits = logits[:1].clone()
    state.derive()
    assert float(steps.read_entropy(state)[0, 1]) == 0.0
