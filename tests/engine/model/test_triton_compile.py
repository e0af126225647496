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


# Shared memory a block may use on an H100/H200 (227 KB)
HOPPER_SHARED_BYTES = 232448


def compile_for_hopper(
    fn, signature: dict[str, str], constexprs: dict[str, object], warps: int = 4, stages: int = 3
):
    """Compiles `fn` for sm_90 and returns the compiled kernel; any error fails the test, once
    `hopper_compiler` found the compiler here."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**signature, **dict.fromkeys(constexprs, "constexpr")}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages}
    )


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
    ("scaled", "products", "block_m", "block_k"),
    [(False, "bf16", 16, 128), (True, "bf16", 16, 128), (True, "fp16", 16, 256), (True, "fp32", 16, 256),
     (True, "fp8e4nv", 16, 128), (True, "fp8e4nv", 64, 128)],
)  # fmt: skip
def test_the_experts_kernels_compile(scaled, products, block_m, block_k):
    from dfim.engine.model import triton_moe_kernels as kernels

    weights = "*fp8e4nv" if scaled else "*bf16"
    fp8_act = products == "fp8e4nv"
    blocks = {"BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": block_k, "EXACT": products == "fp32", "SCALED": scaled,
              "FP8_ACT": fp8_act}  # fmt: skip
    ints = dict.fromkeys(("w_e", "w_n", "w_k"), "i32")
    gate_up = compile_for_hopper(
        kernels.gate_up_act,
        {"x_ptr": f"*{products}", "w_ptr": weights, "scale_ptr": "*fp32", "token_ptr": "*i64",
         "active_ptr": "*i32", "offs_ptr": "*i32", "h_ptr": f"*{products}", "n_hidden": "i32", "n_inter": "i32",
         "x_stride": "i32", **ints, "h_stride": "i32", "x_scale_ptr": "*fp32", "h_scale_ptr": "*fp32"},
        {**blocks, "ROUND": False},
    )  # fmt: skip
    down = compile_for_hopper(
        kernels.down_weighted,
        {"h_ptr": f"*{products}", "w_ptr": weights, "scale_ptr": "*fp32", "slot_ptr": "*i64",
         "weight_ptr": "*fp32", "active_ptr": "*i32", "offs_ptr": "*i32", "out_ptr": "*fp32", "n_inter": "i32",
         "n_hidden": "i32", "h_stride": "i32", **ints, "out_stride": "i32", "h_scale_ptr": "*fp32"},
        {**blocks, "BLOCK_K": 64} if fp8_act else blocks,  # W8A8: a reduction step is one group of scales
    )  # fmt: skip
    if fp8_act and block_m == 64:  # 64 rows: Hopper's warpgroup MMA on FP8 operands, nothing widened
        for kernel in (gate_up, down):
            assert "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3" in kernel.asm["ptx"]


@pytest.mark.parametrize(
    "tiles",
    [
        "typing",  # a typing fill's two 32-token rows: a few pairs an expert
        "block",  # a 256-token canvas: 16 pairs an expert, the down product on tiles of its own
        "64 pairs",
    ],
)
def test_the_weights_first_w8a8_kernels_run_on_fp8_tensor_cores(tiles):
    """With the weights as the first operand, Hopper's FP8 warpgroup MMA multiplies an expert's pairs as
    they are, 16 of them as well as 64: the PTX of the tiles `moe_triton` launches holds its e4m3 instruction
    and no widening to float16."""
    from dfim.engine.model import triton_moe
    from dfim.engine.model import triton_moe_kernels as kernels

    t = {
        "typing": triton_moe.tiles_for(64 * 8, 128, fp8=True, fp8_act=True),
        "block": triton_moe.tiles_for(256 * 8, 128, fp8=True, fp8_act=True),
        "64 pairs": triton_moe.Tiles(block_m=64, block_n=128, block_k=128, weights_first=True),
    }[tiles]
    down = t.down or t
    assert t.weights_first and t.block_n % down.block_k == 0
    ints = dict.fromkeys(("w_e", "w_n", "w_k"), "i32")
    gate_up = compile_for_hopper(
        kernels.gate_up_act_w8a8,
        {"x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "token_ptr": "*i64",
         "active_ptr": "*i32", "offs_ptr": "*i32", "h_ptr": "*fp8e4nv", "n_hidden": "i32", "n_inter": "i32",
         "x_stride": "i32", **ints, "h_stride": "i32", "x_scale_ptr": "*fp32", "h_scale_ptr": "*fp32"},
        {"BLOCK_M": t.block_m, "BLOCK_N": t.block_n, "BLOCK_K": t.block_k, "ROUND": False},
        t.num_warps, t.num_stages,
    )  # fmt: skip
    down_kernel = compile_for_hopper(
        kernels.down_weighted_w8a8,
        {"h_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "slot_ptr": "*i64",
         "weight_ptr": "*fp32", "active_ptr": "*i32", "offs_ptr": "*i32", "out_ptr": "*fp32", "n_inter": "i32",
         "n_hidden": "i32", "h_stride": "i32", **ints, "out_stride": "i32", "h_scale_ptr": "*fp32"},
        {"BLOCK_M": down.block_m, "BLOCK_N": down.block_n, "BLOCK_K": down.block_k, "GROUP": t.block_n},
        down.num_warps, down.num_stages,
    )  # fmt: skip
    for kernel, block_m in ((gate_up, t.block_m), (down_kernel, down.block_m)):
        ptx = kernel.asm["ptx"]
        assert f"wgmma.mma_async.sync.aligned.m64n{block_m}k32.f32.e4m3.e4m3" in ptx
        assert "cvt.rn.f16x2.e4m3x2" not in ptx
        assert kernel.metadata.shared <= HOPPER_SHARED_BYTES


def test_the_activations_quantizer_compiles():
    from dfim.engine.model import triton_moe_kernels as kernels

    compile_for_hopper(
        kernels.quantize_rows,
        {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "n_cols": "i32", "x_stride": "i32"},
        {"BLOCK": 4096, "ROUND": False},
    )


def test_the_sort_and_sum_kernels_compile():
    from dfim.engine.model import triton_moe_kernels as kernels

    sort_args = {"index_ptr": "*i64", "order_ptr": "*i64", "token_ptr": "*i64", "offs_ptr": "*i32",
                 "active_ptr": "*i32", "n_pairs": "i32", "k": "i32", "n_experts": "i32", "n_active": "i32"}  # fmt: skip
    compile_for_hopper(kernels.sort_pairs, sort_args, {"PAIRS": 512, "EXPERTS": 128})
    for pairs in (2048, 8192):  # a block's pairs, and the most one program holds (MAX_SORTED_PAIRS)
        compile_for_hopper(kernels.sort_pairs_by_expert, sort_args, {"PAIRS": pairs, "EXPERTS": 128})
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


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_every_attention_tile_compiles_within_shared_memory(dtype):
    """Each tile `blocks_for` picks, and a value-sliced one, for both head widths of the 26B shape: a tile
    past the shared memory a block may have builds under the interpreter but not on the GPU."""
    from dfim.engine.model import triton_attention_kernels as kernels
    from dfim.engine.model.triton_attention import Tiles, blocks_for

    exact = dtype == "fp32"
    signature = {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "v_ptr": f"*{dtype}", "bounds_ptr": "*i32",
                 "out_ptr": f"*{dtype}", "part_ptr": "*fp32", "stats_ptr": "*fp32", "seq_len": "i32",
                 "groups": "i32", "key_lo": "i32", "key_hi": "i32", "keys_per_split": "i32",
                 "k_head_stride": "i64", "out_row_stride": "i64"}  # fmt: skip
    cases = [(d, blocks_for(d, rows, exact)) for d in (256, 512) for rows in (8, 128, 512, 2048)]
    cases.append((512, Tiles(64, 32, warps=8, block_dv=128)))
    for head_dim, tiles in cases:
        constexprs = {"HEAD_DIM": head_dim, "BLOCK_M": tiles.block_m, "BLOCK_N": tiles.block_n, "SPLIT": True,
                      "EXACT": exact, "BLOCK_DV": tiles.block_dv or head_dim}  # fmt: skip
        compiled = compile_for_hopper(kernels.attend_keys, signature, constexprs, tiles.warps, tiles.stages)
        assert compiled.metadata.shared <= HOPPER_SHARED_BYTES, (head_dim, tiles, compiled.metadata.shared)


def test_the_soft_cap_compiles():
    from dfim.engine.model import triton_norm_kernels as kernels

    compile_for_hopper(
        kernels.softcap_rows,
        {
            "x_ptr": "*bf16",
            "out_ptr": "*fp32",
            "n_cols": "i32",
            "x_stride": "i32",
            "out_stride": "i32",
            "cap": "fp32",
        },
        {"BLOCK": 4096},
        warps=8,
    )


def test_the_one_row_product_compiles():
    from dfim.engine.model import triton_gemv_kernels as kernels

    for gated, block_n, block_k in ((False, 2, 1024), (True, 4, 512)):
        compile_for_hopper(
            kernels.gemv_rows,
            {
                "x_ptr": "*bf16",
                "w_ptr": "*bf16",
                "out_ptr": "*bf16",
                "n_out": "i32",
                "n_in": "i32",
                "w_stride": "i64",
            },
            {"GATED": gated, "BLOCK_N": block_n, "BLOCK_K": block_k},
        )


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
