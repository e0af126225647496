"""A fill's confidence summary (FillResult.confidence): the tokens it covers, and the log-likelihoods the
sampler leaves for it without another model pass."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dfim.engine import Engine, FillRequest, SamplerSettings
from dfim.engine.api import TokenScore
from dfim.engine.inference import sampler
from dfim.engine.inference.confidence import shown_tokens, summarize
from dfim.engine.inference.sampler_steps import build_chain
from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR, write_random_checkpoint
from tests.engine.inference.sampler_helpers import V, make_state

TOKENIZER_JSON = Path(__file__).resolve().parents[3] / "engine" / "weights" / "dfim-small" / "tokenizer.json"


def score(text: str, p: float, pinned: bool = False, conf: float = 0.9) -> TokenScore:
    return TokenScore(text, conf, pinned, 0.0 if pinned else math.log(p))


def test_summary_covers_only_the_predicted_tokens_of_the_text_shown():
    scores = [
        score("x", 1.0, pinned=True),
        score(" =", 0.5),
        score(" 1", 0.25),
        score("\n", 0.01),
        score("y", 0.01),
    ]
    # the text was cut at the line break: the newline and what follows were never shown
    summary = summarize("x = 1", scores)
    assert summary is not None and summary.tokens == 2
    assert summary.mean_logprob == pytest.approx((math.log(0.5) + math.log(0.25)) / 2)
    assert summary.min_logprob == pytest.approx(math.log(0.25))
    assert summary.mean_entropy == pytest.approx(-math.log(0.9))
    # a token that starts inside the text counts even when the cut falls inside it
    assert [s.text for s in shown_tokens("x = 1\n", [*scores[:3], score("\ny", 0.5)])][-1] == "\ny"


def test_no_predicted_token_gives_no_summary():
    assert summarize("", [score("a", 0.5)]) is None
    assert summarize("ab", [score("ab", 1.0, pinned=True)]) is None


def test_a_flat_distribution_is_less_sure_than_a_peaked_one():
    sure = summarize("ab", [score("a", 0.9, conf=0.9), score("b", 0.9, conf=0.9)])
    unsure = summarize("ab", [score("a", 0.9, conf=0.9), score("b", 0.1, conf=0.05)])
    assert sure is not None and unsure is not None
    assert unsure.min_logprob < sure.min_logprob and unsure.max_entropy > sure.max_entropy


def test_token_logprob_is_the_log_softmax_of_the_last_processed_logits():
    settings = SamplerSettings(max_steps=1, t_min=1.0, t_max=1.0)
    logits = torch.randn(2, 4, V, generator=torch.Generator().manual_seed(3)) * 4
    state = make_state(length=4, batch=2)
    sampler.denoise_step(state, build_chain(settings), logits)
    ids = sampler.commit(state)
    expected = torch.log_softmax(state.logits, dim=-1).gather(-1, ids[..., None])[..., 0]
    assert torch.allclose(sampler.token_logprob(state, ids), expected, atol=1e-5)
    state.dist = None  # a row finished early: no derived distribution is kept, the logits are
    assert torch.allclose(sampler.token_logprob(state, ids), expected, atol=1e-5)
    # the argmax token: its log p is at least minus the entropy there (min-entropy <= Shannon entropy)
    assert bool((expected >= -state.entropy - 1e-5).all())


@pytest.fixture(scope="module")
def random_engine(tmp_path_factory):
    return Engine.load(write_random_checkpoint(tmp_path_factory.mktemp("ckpt"), TOKENIZER_JSON, seed=4))


@pytest.mark.parametrize("candidates", [1, 2])
def test_fill_result_carries_the_summary_of_its_own_text(random_engine, candidates):
    request = FillRequest(
        prefix="def add(a, b):\n    return ",
        suffix="\n",
        max_tokens=16,
        seed=1,
        candidates=candidates,
        settings=SamplerSettings(max_steps=4),
    )
    result = random_engine.fill(request)
    assert result.confidence == summarize(result.text, result.token_scores)
    assert len(result.alternative_confidence) == len(result.alternatives)
    free = [s for s in result.token_scores if not s.pinned]
    assert free and all(s.logprob <= 0.0 for s in free)
    # undrafted: each token is its position's argmax, so log p >= log(exp(-entropy)) = log(confidence)
    assert all(s.logprob >= math.log(s.confidence) - 1e-4 for s in free)


def test_a_drafted_line_is_scored_by_the_encoder_that_wrote_it():
    """The denoiser reads the draft's tokens in its input and echoes them (its entropy is ~0 whether the
    line is right or not); the summary's likelihood is the encoder's, which wrote them unseen."""
    engine = Engine.load(DEFAULT_MODEL_DIR, threads=1)
    settings = replace(engine.settings, max_steps=8, draft=True)
    # A comment's words: no model can be sure of them (dfim-base v3 is sure of `x = [0, 0, ...`, an earlier
    # prompt here); the line is drafted and confirmed in one step.
    request = FillRequest(
        prefix="# TODO: ", suffix="\n", stop=("\n",), seed=0, settings=settings, max_tokens=32
    )
    result = engine.fill(request)
    assert result.confidence is not None and result.text
    assert result.confidence.mean_entropy < 0.05  # the echo
    assert result.confidence.mean_logprob < -0.05  # the encoder was far from sure of the comment
