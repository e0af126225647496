"""The sampler's state: constraints fixed for a canvas, and the distribution derived once per step."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dfim.engine.inference.canvas import CanvasPlan
from dfim.engine.inference.sampler_state import (
    Constraints,
    Distribution,
    first_index,
    pad_after_eos,
    plan_constraints,
    up_to,
)
from tests.engine.inference.sampler_helpers import EOS, PAD, V


def rules(pins: dict[int, int], length: int = 6, **kw) -> Constraints:
    pinned = torch.zeros(length, dtype=torch.bool)
    pin_ids = torch.zeros(length, dtype=torch.long)
    for position, token in pins.items():
        pinned[position], pin_ids[position] = True, token
    return Constraints.build(pinned, pin_ids, vocab_size=V, eos_id=EOS, pad_id=PAD, **kw)


def test_free_positions_before_the_last_text_pin_may_not_end():
    # a pinned token at 3: an EOS at 0-2 would cut it off; after it the text may end
    assert rules({3: 9}).no_end.tolist() == [True, True, True, False, False, False]
    # pinned padding is no text to protect; an explicit inner hole stays
    inner = torch.tensor([False, False, False, False, True, False])
    assert rules({2: PAD}, no_end=inner).no_end.tolist() == inner.tolist()
    assert rules({}).no_end is None


def test_constraints_are_fixed_and_their_derived_masks_computed_once():
    c = rules({1: 7}, stop_starts=torch.zeros(V, dtype=torch.bool).index_fill(0, torch.tensor([12]), True))
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.banned = None  # type: ignore[misc]
    assert c.free.tolist() == [True, False, True, True, True, True] and c.free is c.free
    assert c.ends is not None and c.ends is c.ends
    assert c.ends.nonzero().flatten().tolist() == [EOS, 12]
    assert c.stop_starts is not None and not bool(c.stop_starts[EOS])  # the request's mask is left as it was
    assert rules({}).ends is None


def test_distribution_derives_each_value_once_from_the_logits():
    logits = torch.zeros(1, 2, V)
    logits[0, 0, 3] = 100.0  # position 0 certain, position 1 uniform
    logits[0, 1, 0] = float("-inf")  # a masked token takes no mass and leaves no NaN
    dist = Distribution(logits)
    assert dist.probs is dist.probs and dist.mode is dist.mode and dist.entropy is dist.entropy
    assert dist.mode[0, 0].item() == 3
    assert dist.entropy[0, 0].item() == pytest.approx(0.0, abs=1e-6)
    assert dist.entropy[0, 1].item() == pytest.approx(math.log(V - 1), rel=1e-5)
    conf, token = dist.top
    assert token[0, 0].item() == 3 and conf[0, 0].item() == pytest.approx(1.0)
    assert conf[0, 1].item() == pytest.approx(1 / (V - 1))


def test_distribution_entropy_matches_the_definition():
    logits = torch.randn(3, 5, V, generator=torch.Generator().manual_seed(0)) * 4
    p = torch.softmax(logits, dim=-1)
    assert torch.allclose(Distribution(logits).entropy, -(p * p.log()).sum(-1), atol=1e-5)


def test_row_helpers():
    mask = torch.tensor([[False, True, True], [False, False, False]])
    assert first_index(mask).tolist() == [1, 3]
    assert up_to(torch.tensor([0, 2]), 3).tolist() == [[True, False, False], [True, True, True]]
    ids = torch.tensor([[5, EOS, 7], [5, 6, 7]])
    assert pad_after_eos(ids, EOS, PAD).tolist() == [[5, EOS, PAD], [5, 6, 7]]


def test_a_plan_s_constraints_hold_its_pins_holes_and_healing_set():
    plan = CanvasPlan(
        context_ids=[3],
        length=4,
        pinned=[False, False, True, False],
        pin_ids=[0, 0, 9, 0],
        no_end=[False, True, False, False],
        open_start=3,
        heal_allowed=[5, 6],
    )
    banned = torch.zeros(V, dtype=torch.bool)
    stop = torch.zeros(V, dtype=torch.bool).index_fill(0, torch.tensor([12]), True)
    c = plan_constraints(plan, banned, eos_id=EOS, pad_id=PAD, stop_tokens=stop)
    assert c.pinned.tolist() == plan.pinned and c.pin_ids.tolist() == plan.pin_ids
    assert c.no_end.tolist() == [True, True, False, False]  # position 0 lies before the pin too
    assert list(c.allowed_at) == [0] and c.allowed_at[0].nonzero().flatten().tolist() == [5, 6]
    assert c.vocab_size == V and c.banned is banned and c.stop_tokens is stop and c.stop_starts is None
    assert (
        plan_constraints(
            dataclasses.replace(plan, heal_allowed=[]), banned, eos_id=EOS, pad_id=PAD
        ).allowed_at
        == {}
    )
