"""The engine on the fast path's backend gives the fills the plain network gives: the same canvas at every
step, the same steps and stop reasons, the same text, for the same seed and request, with every rule of the
sampler chain in play (pins, inner holes, banned tokens, token healing, the window, stop strings, a draft,
candidates, continuation blocks, a fill nested in another's step on another cache slot).

fp32 on the CPU, no CUDA graphs (they replay exactly this code on the GPU); the fast engine's static cache
uses small graph buckets, so its context crosses bucket edges. Tolerance: the two backends' logits agree to
1e-4 (tests/engine/model/test_fast_path.py; here the confidences exp(-entropy) reported per step agree to
1e-4 too); every discrete outcome (token ids, accepted positions, steps, stop reasons, text) must be equal.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dfim.engine import Engine, FillRequest, Hole, SamplerSettings
from dfim.engine.api import StepInfo
from dfim.engine.inference.chat import load_tokenizer
from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR, load_model, write_random_checkpoint

TOLERANCE = 1e-4
ROOT = Path(__file__).resolve().parents[3]
TOKENIZER_JSON = ROOT / "engine" / "weights" / "dfim-small" / "tokenizer.json"


def make_engine(folder: Path, fast: bool) -> Engine:
    """An engine over fp32 weights as loaded, without the CPU re-layout (whose fp16 copies serve some row
    counts and not others, and the two backends batch rows differently)."""
    model, settings = load_model(folder)
    engine = Engine(model, load_tokenizer(folder), settings, folder.name, False, folder, fast=fast)
    engine.fast_bucket, engine.fast_max_len = 16, 1024
    return engine


@pytest.fixture(scope="module")
def trained():
    """The shipped model: confident enough that drafts are confirmed and rows stop early."""
    folder = Path(DEFAULT_MODEL_DIR)
    return make_engine(folder, fast=False), make_engine(folder, fast=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random model with both layer kinds and a sliding window shorter than the context."""
    folder = write_random_checkpoint(
        tmp_path_factory.mktemp("ckpt"),
        TOKENIZER_JSON,
        seed=3,
        num_hidden_layers=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        sliding_window=12,
        num_experts=4,
        top_k_experts=2,
        canvas_length=32,
    )
    return make_engine(folder, fast=False), make_engine(folder, fast=True)


def run(engine: Engine, request: FillRequest) -> tuple:
    steps: list[StepInfo] = []
    result = engine.fill(FillRequest(**{**request.__dict__, "on_step": steps.append}))
    return result, steps


def assert_same_fill(plain: Engine, fast: Engine, request: FillRequest) -> None:
    want, want_steps = run(plain, request)
    got, got_steps = run(fast, request)
    assert fast._fast_backend is not None and fast._fast_backend.owner is not None  # it did run
    assert [(s.block, s.step, s.token_ids, s.accepted_mask) for s in got_steps] == [
        (s.block, s.step, s.token_ids, s.accepted_mask) for s in want_steps
    ]
    for a, b in zip(got_steps, want_steps, strict=True):
        assert max(abs(x - y) for x, y in zip(a.confidence, b.confidence, strict=True)) <= TOLERANCE
    assert (got.text, got.steps, got.stop_reason, got.tokens, got.blocks, got.alternatives) == (
        want.text,
        want.steps,
        want.stop_reason,
        want.tokens,
        want.blocks,
        want.alternatives,
    )


PREFIX = "import os\n\n\ndef read_lines(path):\n    with open(path) as handle:\n        "
SUFFIX = "\n\n\ndef main():\n    print(read_lines(os.sys.argv[1]))\n"


@pytest.mark.parametrize(
    ("fields", "overrides"),
    [
        # a single line from the encoder's draft, cut at the newline (stop tokens, the checkpoint's window)
        (dict(max_tokens=16, stop=("\n",), seed=0), dict(draft=True)),
        # token healing: the prefix ends inside a word
        (dict(prefix=PREFIX + "return hand", max_tokens=16, stop=("\n",), seed=1), dict(draft=False)),
        # three candidates from noise in one batch, ranked by likelihood; no window
        (dict(max_tokens=32, candidates=3, seed=2), dict(window=0, rank="likelihood", draft=False)),
        # a skeleton: pins and inner holes filled to their width
        (dict(middle=["lines = ", Hole(6), "\n        return ", Hole(4)], seed=3), dict(draft=False)),
    ],
    ids=["draft-line", "healing", "candidates", "skeleton"],
)
def test_trained_model_fills_the_same_on_both_backends(trained, fields, overrides):
    plain, fast = trained
    settings = replace(plain.settings, max_steps=12, **overrides)
    request = FillRequest(**{"prefix": PREFIX, "suffix": SUFFIX, "settings": settings, **fields})
    assert_same_fill(plain, fast, request)


def test_random_model_continuation_blocks_and_a_nested_fill(tiny):
    """Continuation blocks re-sync the static cache to the row's context, a fill run between another's
    steps moves it to another slot and back, and a context longer than the window and than several graph
    buckets exercises every slice of the static cache."""
    plain, fast = tiny
    settings = SamplerSettings(max_steps=4, window=4)
    for engine in (plain, fast):
        engine.settings = settings
    prefix = "def f(x):\n" + "    x = x + 1\n" * 8
    inner = FillRequest(
        prefix="a = ", suffix="\n", max_tokens=8, seed=9, settings=settings, cache_slot="other"
    )
    inner_results: dict[bool, list[str]] = {False: [], True: []}

    def nested(engine: Engine) -> FillRequest:
        def between() -> None:
            if len(inner_results[engine.fast]) < 2:
                inner_results[engine.fast].append(engine.fill(inner).text)

        return FillRequest(
            prefix=prefix, suffix="\n", max_tokens=80, seed=4, settings=settings, between_steps=between
        )

    want, want_steps = run(plain, nested(plain))
    got, got_steps = run(fast, nested(fast))
    assert inner_results[True] == inner_results[False] and len(inner_results[True]) == 2
    assert [(s.block, s.token_ids) for s in got_steps] == [(s.block, s.token_ids) for s in want_steps]
    assert (got.text, got.steps, got.blocks, got.stop_reason) == (
        want.text,
        want.steps,
        want.blocks,
        want.stop_reason,
    )
    # the random model never ends its text: the fill ran on into a continuation block
    assert got.blocks >= 2
    assert_same_fill(
        plain, fast, FillRequest(prefix=prefix, suffix="\n", max_tokens=16, seed=5, stop=("\n",))
    )


def test_typing_encodes_only_what_was_typed_on_the_fast_path(tiny):
    """Each fill's new context tokens run through the fast path's encoder (padded chunks, as graphs need
    on a GPU) and land in both caches: the fills, and the keys and values the plain network's draft and
    ranking read, are the plain engine's."""
    plain, fast = tiny
    backend = fast.fast_backend()
    assert fast.cache.runner is backend
    backend.fast.pad_encode = True
    try:
        for typed in ("", "y", "y = x", "y = x * (x"):
            request = FillRequest(prefix="def f(x):\n    " + typed, suffix="\n", max_tokens=8, seed=6)
            assert_same_fill(plain, fast, replace(request, stop=("\n",)))
            assert fast.cache.ids == plain.cache.ids
            assert backend.held == fast.cache.ids and backend.fast.length == len(fast.cache.ids)
            for (k, v), (want_k, want_v) in zip(
                (fast.cache.kv.get(i) for i in range(len(fast.cache.kv.keys))),
                (plain.cache.kv.get(i) for i in range(len(plain.cache.kv.keys))),
                strict=True,
            ):
                assert k is not None and v is not None and want_k is not None and want_v is not None
                assert (k - want_k).abs().max() <= TOLERANCE and (v - want_v).abs().max() <= TOLERANCE
    finally:
        backend.fast.pad_encode = False


def test_the_draft_reads_its_logits_from_the_fast_path(trained, monkeypatch):
    """The encoder's greedy draft runs its passes on the fast path (the plain network's eager passes are what
    a GPU would wait for), in padded chunks, and drafts what the plain engine drafts."""
    plain, fast = trained
    backend = fast.fast_backend()
    asked: list[int] = []
    encode = backend.encode

    def spy(cache, ids, logit_rows):
        asked.append(logit_rows)
        return encode(cache, ids, logit_rows)

    monkeypatch.setattr(backend, "encode", spy)
    monkeypatch.setattr(backend.fast, "pad_encode", True)
    settings = replace(plain.settings, max_steps=12, draft=True)
    request = FillRequest(
        prefix=PREFIX + "lines = ", suffix=SUFFIX, max_tokens=16, stop=("\n",), seed=7, settings=settings
    )
    assert_same_fill(plain, fast, request)
    assert sum(1 for rows in asked if rows > 0) >= 2  # the draft's first pass and at least one token


def test_a_context_beyond_the_static_cache_falls_back_to_the_plain_network(tiny):
    _, fast = tiny
    backend = fast.fast_backend()
    assert backend.fits(1024 - 32, 32) and not backend.fits(1024 - 31, 32) and not backend.fits(0, 33)


def test_engine_load_turns_the_fast_path_on_for_cuda_only(tiny):
    """Engine.load's default is the device's (CUDA: on); asked for on the CPU it runs there too, over the
    CPU re-layout of the weights."""
    path = tiny[0].path
    assert not Engine.load(path).fast
    engine = Engine.load(path, fast=True)
    assert engine.fast
    result = engine.fill(FillRequest(prefix="x = ", suffix="\n", max_tokens=8, seed=0, stop=("\n",)))
    assert engine._fast_backend is not None and engine._fast_backend.held == engine.cache.ids
    assert 1 <= result.steps


def test_a_fixed_step_block_reads_nothing_back_per_step(monkeypatch):
    """The benchmark's loop (stop steps off, no stop strings) never waits for the device inside a step: the
    reads of a whole block do not grow with its steps (on a GPU each read would stall the queue)."""
    import torch

    from dfim.engine.inference.fast_backend import fixed_step_block

    reads: list[str] = []
    for name in ("__bool__", "item", "tolist", "nonzero", "__int__", "__float__", "__index__"):
        original = getattr(torch.Tensor, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, spy)
    logits = torch.randn(1, 8, 50, generator=torch.Generator().manual_seed(0))
    counts = []
    for steps in (3, 9):
        reads.clear()
        fixed_step_block(
            lambda canvas, self_cond: logits.clone(),
            length=8,
            vocab_size=50,
            eos_id=1,
            pad_id=0,
            steps=steps,
            generator=torch.Generator().manual_seed(1),
        )
        counts.append(len(reads))
    assert counts[0] == counts[1], reads


def test_path_info_says_where_fills_denoise(tmp_path):
    """dfim/stats reports it (scripts/bench_gpu_server.py prints it): the fast path's part once a fill built it."""
    folder = write_random_checkpoint(tmp_path / "ckpt", TOKENIZER_JSON, canvas_length=32)
    plain, fast = make_engine(folder, fast=False), make_engine(folder, fast=True)
    assert plain.path_info() == {
        "device": "cpu",
        "dtype": "float32",
        "fast": False,
        "fast_path": None,
        "sampler": "torch",
        "cpu_products": "fp32",  # a random fp32 checkpoint: no fp16 copies (they would round its weights)
    }
    assert fast.path_info()["fast_path"] is None  # built by the first fill
    fast.fill(FillRequest(prefix="x = ", suffix="\n", max_tokens=8, settings=SamplerSettings(max_steps=2)))
    assert fast.path_info()["fast_path"] == {
        "graphs": False,  # CUDA only
        "graphs_captured": 0,
        "experts": fast.model.decoder.layers[0].experts.mode,
        "attention": "sdpa",  # the Triton kernels: CUDA only
        "fused_kernels": False,
        "compiled": False,  # the engine never compiles the layers
    }
