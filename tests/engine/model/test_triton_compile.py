"""The Triton kernels compile for a Hopper GPU (sm_90) ahead of time, here, without one.

Triton's interpreter, which runs the kernels' arithmetic checks on the CPU, accepts code its compiler
refuses (a conditional expression over constexprs as a tensor shape compiled in neither, and was first found
on the GPU machine, where every expert then ran on the padded fallback). Compiling each kernel for sm_90 with
the argument types the wrappers pass finds those before a GPU run. Skips where Triton is not installed (the
CPU-only install) or cannot compile for CUDA here."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")


def compile_for_hopper(fn, signature: dict[str, str], constexprs: dict[str, object]) -> None:
    """Compiles `fn` for sm_90; any error fails the test, once `hopper_compiler` found the compiler here."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**signature, **dict.fromkeys(constexprs, "constexpr")}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


@pytest.fixture(scope="module", autouse=True)
def hopper_compiler() -> None:
    """Skips where Triton cannot compile for CUDA at all (no CUDA backend or ptxas in this install): tried on a
    kernel of a few lines, so a failure of ours is never mistaken for a missing compiler."""
    import triton
    import triton.language as tl

    @triton.jit
    def copy(src, dst, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(dst + offsets, tl.load(src + offsets))

    try:
        compile_for_hopper(copy, {"src": "*fp32", "dst": "*fp32"}, {"BLOCK": 16})
    except Exception as err:  # noqa: BLE001 - whatever stops the compiler here: nothing to test
        pytest.skip(f"Triton cannot compile for CUDA here: {type(err).__name__}: {err}")


@pytest.mark.parametrize(
    ("scaled", "products", "block_k"),
    [(False, "bf16", 128), (True, "bf16", 128), (True, "fp16", 256), (True, "fp32", 256)],
)
def test_the_experts_kernels_compile(scaled, products, block_k):
    from dfim.engine.model import triton_moe_kernels as kernels

    weights = "*fp8e4nv" if scaled else "*bf16"
    blocks = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": block_k, "EXACT": products == "fp32", "SCALED": scaled}
    ints = dict.fromkeys(("w_e", "w_n", "w_k"), "i32")
    compile_for_hopper(
        kernels.gate_up_act,
        {"x_ptr": f"*{products}", "w_ptr": weights, "scale_ptr": "*fp32", "token_ptr": "*i64",
         "active_ptr": "*i32", "offs_ptr": "*i32", "h_ptr": f"*{products}", "n_hidden": "i32", "n_inter": "i32",
         "x_stride": "i32", **ints, "h_stride": "i32"},
        blocks,
    )  # fmt: skip
    compile_for_hopper(
        kernels.down_weighted,
        {"h_ptr": f"*{products}", "w_ptr": weights, "scale_ptr": "*fp32", "slot_ptr": "*i64",
         "weight_ptr": "*fp32", "active_ptr": "*i32", "offs_ptr": "*i32", "out_ptr": "*fp32", "n_inter": "i32",
         "n_hidden": "i32", "h_stride": "i32", **ints, "out_stride": "i32"},
        blocks,
    )  # fmt: skip


def test_the_sort_and_sum_kernels_compile():
    from dfim.engine.model import triton_moe_kernels as kernels

    compile_for_hopper(
        kernels.sort_pairs,
        {"index_ptr": "*i64", "order_ptr": "*i64", "token_ptr": "*i64", "offs_ptr": "*i32", "active_ptr": "*i32",
         "n_pairs": "i32", "k": "i32", "n_experts": "i32", "n_active": "i32"},
        {"PAIRS": 512, "EXPERTS": 128},
    )  # fmt: skip
    compile_for_hopper(
        kernels.sum_pairs, {"src_ptr": "*fp32", "out_ptr": "*bf16", "n_cols": "i32"}, {"K": 8, "BLOCK": 1024}
    )


def test_the_attention_kernels_compile():
    from dfim.engine.model import triton_attention_kernels as kernels

    compile_for_hopper(
        kernels.store_rows,
        {"k_ptr": "*bf16", "v_ptr": "*bf16", "cache_k_ptr": "*bf16", "cache_v_ptr": "*bf16", "slot_ptr": "*i64",
         "seq_len": "i32", "cache_len": "i32", "head_dim": "i32"},
        {"BLOCK_D": 512},
    )  # fmt: skip


def test_the_sampler_kernels_compile():
    from dfim.engine.inference import triton_sampler_kernels as kernels

    ints = {"n_vocab": "i32", "row_stride": "i32", "n_chunks": "i32"}
    compile_for_hopper(
        kernels.chunk_stats,
        {"logits_ptr": "*fp32", "stats_ptr": "*fp32", "first_ptr": "*i32", **ints},
        {"BLOCK": 4096},
    )
    compile_for_hopper(
        kernels.combine_rows,
        {"logits_ptr": "*fp32", "u_ptr": "*fp32", "stats_ptr": "*fp32", "first_ptr": "*i32", "mode_ptr": "*i64",
         "entropy_ptr": "*fp32", "lse_ptr": "*fp32", "sampled_ptr": "*i64", **ints},
        {"BLOCK": 4096, "CHUNKS": 64, "SAMPLE": True},
    )  # fmt: skip
