"""ContextCache: reuse of the encoded context across requests, against a random tiny checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dfim.engine.inference.cache import ContextCache, common_prefix_length
from dfim.engine.model.checkpoint import load_model, write_random_checkpoint
from dfim.engine.model.tokenizer import Tokenizer

TOKENIZER_JSON = Path(__file__).resolve().parents[3] / "engine" / "weights" / "dfim-small" / "tokenizer.json"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = write_random_checkpoint(tmp_path_factory.mktemp("ckpt"), TOKENIZER_JSON, seed=3)
    model, _ = load_model(folder)
    return model


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(TOKENIZER_JSON)


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([9], [1]) == 0


def test_typing_at_the_end_of_the_prefix_reencodes_only_the_tail(model, tok):
    suffix = tok.encode("\n\nprint(total)\n")
    prefix = "import os\n\n\ndef total_size(paths):\n    size = 0\n    for path in paths:\n        size += os.path.getsize"
    cache = ContextCache(model)
    first = tok.fim_context(tok.encode(prefix), suffix)
    assert cache.prepare(first) == len(first)
    assert cache.prepare(first) == 0  # the same context again: nothing to encode
    second = tok.fim_context(tok.encode(prefix + "(pa"), suffix)  # three more characters typed
    encoded = cache.prepare(second)
    assert encoded == len(second) - common_prefix_length(first, second)
    assert 1 <= encoded <= 4 < len(second)
    assert len(cache) == cache.kv.length == len(second)


def test_reused_cache_gives_the_same_logits_as_a_fresh_one(model, tok):
    a = tok.fim_context(tok.encode("def f(x):\n    return x +"), tok.encode("\n"))
    b = tok.fim_context(tok.encode("def f(x):\n    return x * 2 +"), tok.encode("\n"))
    reused = ContextCache(model)
    reused.prepare(a)
    reused.prepare(b)  # truncated to the common run, then the rest encoded
    fresh = ContextCache(model)
    fresh.prepare(b)
    canvas = torch.randint(16, 8192, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        got = model.denoise(canvas, reused.kv, None)
        want = model.denoise(canvas, fresh.kv, None)
    assert torch.allclose(got, want, atol=1e-5)


def test_extend_appends_after_the_context(model, tok):
    cache = ContextCache(model)
    context = tok.fim_context(tok.encode("x = "), [])
    cache.prepare(context)
    assert cache.extend([20, 21, 22]) == 3
    assert cache.ids == context + [20, 21, 22] and cache.kv.length == len(context) + 3
    # the next request for the bare context drops the block again without re-encoding anything
    assert cache.prepare(context) == 0 and cache.kv.length == len(context)


def test_parked_tokens_come_back_without_a_pass_and_only_where_they_belong(model, tok):
    context = tok.fim_context(tok.encode("def f(x):\n    return x +"), tok.encode("\n"))
    head, middle = context[:-1], context[-1:]  # the draft continues `head`; <fim_middle> waits
    cache = ContextCache(model)
    with torch.inference_mode():
        logits = cache.next_logits(head, park=middle)
        want = model.context_lm(torch.tensor([head]), model.new_cache())[0, -1]
        assert torch.allclose(logits, want, atol=1e-4)  # the logits after `head`, not after <fim_middle>
        assert cache.ids == head and cache.kv.length == len(head)
        cache.step([30])  # a drafted token where <fim_middle> will go
        cache.step([31])
        assert cache.prepare(context) == 0  # truncated to `head`, <fim_middle> written back
        fresh = ContextCache(model)
        fresh.prepare(context)
        canvas = torch.randint(16, 8192, (1, 16), generator=torch.Generator().manual_seed(2))
        assert torch.allclose(model.denoise(canvas, cache.kv), model.denoise(canvas, fresh.kv), atol=1e-4)
        assert cache.parked is None  # used once
        # parked keys/values computed after text that is gone since are never used
        cache.next_logits(head, park=middle)
        cache.prepare(head[:-3] + [40, 41, 42])
        assert cache.parked is None
        assert cache.prepare(head[:-3] + [40, 41, 42] + middle) == 1
