"""The fast path's Triton kernels checked where they run: on CUDA, or on the CPU under Triton's interpreter
where Triton is installed (TRITON_INTERPRET=1 with DFIM_TRITON_ON_CPU=1 makes them apply to CPU tensors;
fp32 and fp16 there); without
either (the CPU-only install) the kernel tests skip.

- attention over key intervals (dfim.engine.model.triton_attention) against SDPA with the same mask;
- the fast path's own tests (tests/engine/model/test_fast_path.py) with every kernel in use (fused q/k/v,
  the fused norms, the router and experts' kernels, attention) against the plain network."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from dfim.engine.model import triton_attention

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETER = {**os.environ, "TRITON_INTERPRET": "1", "DFIM_TRITON_ON_CPU": "1"}

CHECK = textwrap.dedent(
    """
    import sys
    import torch
    from dfim.engine.model import triton_attention

    device = sys.argv[1]
    bad = []
    dtypes = [torch.float32, torch.float16] if device == "cpu" else [torch.float32, torch.bfloat16]
    for dtype in dtypes:
        error = triton_attention.self_test(device, dtype)
        limit = 1e-5 if dtype == torch.float32 else 2e-2
        if not error <= limit:
            bad.append(f"attention {dtype}: relative error {error:.2e} > {limit:.0e}")
    # a program writing a slice of a wide head's value dimensions (bench_attention_gpu.py's sweep)
    sliced = triton_attention.Tiles(32, 32, block_dv=128)
    error = triton_attention.self_test(device, torch.float32, ((8, 1, 512), (4, 2, 256)), sliced)
    if not error <= 1e-5:
        bad.append(f"attention, value slices of 128: relative error {error:.2e}")
    # the keys split a fixed number of ways (the sweep's), more than the rule would
    split = triton_attention.Tiles(32, 32, splits=8)
    error = triton_attention.self_test(device, torch.float32, ((4, 2, 64),), split)
    if not error <= 1e-5:
        bad.append(f"attention, keys split 8 ways: relative error {error:.2e}")
    print("\\n".join(bad) or "ok")
    """
)


def test_interval_mask_is_the_union_of_two_intervals():
    bounds = torch.tensor([[0, 3, 5, 6], [2, 4, 0, 0]], dtype=torch.int32)
    mask = triton_attention.interval_mask(bounds, 1, 7)  # keys 1..6
    assert mask.tolist() == [
        [True, True, False, False, True, False],
        [False, True, True, False, False, False],
    ]


def test_kernels_match_the_reference(kernel_check, kernel_target):
    kernel_check(CHECK, *kernel_target)


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
def test_fast_path_with_every_kernel_matches_the_plain_network():
    tests = "denoise_logits_match or candidate_rows or autoregressive_logits"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/engine/model/test_fast_path.py",
         "-k", tests],
        env=INTERPRETER, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0 and "3 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


USES_KERNELS = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, "tests/engine/model")
    from test_fast_path import fast_of, make_model

    info = fast_of(make_model()).describe()
    want = {"attention": "triton", "fused_kernels": True, "experts": "triton"}
    print("ok" if all(info[k] == v for k, v in want.items()) else info)
    """
)


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
def test_the_interpreted_fast_path_runs_every_kernel(kernel_check):
    """What makes the test above a test of the kernels: under the interpreter the fast path picks them all."""
    kernel_check(USES_KERNELS, "cpu", INTERPRETER)


def test_blocks_for_every_regime_gives_tiles_a_dot_can_take():
    for head_dim in (64, 256, 512):
        for rows in (1, 16, 17, 80, 256, 257, 2048):
            block_m, block_n, warps, stages, block_dv, splits = triton_attention.blocks_for(head_dim, rows)
            for size in (block_m, block_n):
                assert size >= 16 and size & (size - 1) == 0  # tl.dot takes powers of two from 16
            assert warps in (4, 8) and stages >= 1 and block_dv in (None, head_dim, head_dim // 2)
            assert splits is None  # the programs' count decides, in `attend`
    # a 512-wide head: 128 rows writing half the value's dimensions each; fp32 stays at 32 rows, unsliced
    assert triton_attention.blocks_for(512, 2048) == triton_attention.Tiles(128, 32, 8, 2, 256)
    assert triton_attention.blocks_for(512, 2048, exact=True)[0] == 32
    assert triton_attention.blocks_for(512, 2048, exact=True).block_dv is None
    assert triton_attention.blocks_for(256, 8)[0] == 16
    # fp32 inputs keep a tile whose shared memory fits an H200 (128 x 64 would need ~295 KB)
    assert triton_attention.blocks_for(256, 2048, exact=True) == triton_attention.Tiles(64, 64)


def test_keys_split_until_about_one_program_per_sm():
    # the 26B shape's launches (KV heads x value slices x row blocks) and their key ranges: the counts the
    # H200 sweep found fastest
    assert triton_attention.split_count(2 * 2 * 16, 4352) == 2  # a full layer, a 256-token canvas
    assert triton_attention.split_count(2 * 2 * 4, 4352) == 8  # a full layer, two 32-token rows
    assert triton_attention.split_count(8 * 4, 1535) == 4  # a sliding layer, a 256-token canvas
    assert triton_attention.split_count(8 * 2, 1343) == 8  # a sliding layer, two 32-token rows
    # a split keeps at least MIN_SPLIT_KEYS keys; a full launch is not split; never more than 16 ways
    assert triton_attention.split_count(1, 300) == 2
    assert triton_attention.split_count(triton_attention.TARGET_PROGRAMS, 100_000) == 1
    assert triton_attention.split_count(1, 100_000) == 16
