"""A short GPU check of the fast path as the server runs it (about a minute on one H100/H200).

1. dfim.engine.model.fast_check at the 26B-A4B shape (four layers, fp32, well-conditioned init): the fast
   path with CUDA graphs against our network and transformers' (when installed), layer by layer.
2. RMSNorm's Triton kernel (dfim.engine.model.triton_norm) against the reference arithmetic, fp32 and bf16,
   at the widths the 26B-A4B shape norms (heads, hidden), with and without a weight.
3. The engine on CUDA, fp32, the shipped model: the same requests (a draft, token healing, candidates, a
   skeleton with pins, stop strings) on the fast backend (graphs captured inside the fill) and on the plain
   network must give the same canvas at every step, the same steps, stop reasons and text.
Exit status 0 when both hold, 1 otherwise. Latencies are printed for information (first fills capture graphs).

    python3 scripts/check_fast_gpu.py [--out $OUT/check_fast_gpu.txt] [--skip-hf]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

try:  # installed, or the GPU machine's mirror of the installed layout (scripts/device_env.sh)
    import dfim.engine  # noqa: F401
except ImportError:  # a bare checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dfim.engine import Engine, FillRequest, Hole  # noqa: E402
from dfim.engine.api import StepInfo  # noqa: E402
from dfim.engine.inference.chat import load_tokenizer  # noqa: E402
from dfim.engine.model import fast_check, ops, triton_norm  # noqa: E402
from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR, load_model  # noqa: E402
from dfim.engine.model.config import RELEASED_26B_A4B  # noqa: E402
from dfim.engine.model.fast import FastDiffusionGemma  # noqa: E402

BIG = RELEASED_26B_A4B
# A tiny shape for a dry run on the CPU (--device cpu): the script's own logic, in seconds.
TINY = dict(BIG, vocab_size=512, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, global_head_dim=32, num_global_key_value_heads=1, sliding_window=32, num_experts=16,
            top_k_experts=4, moe_intermediate_size=32, canvas_length=32)  # fmt: skip
PREFIX = "import os\n\n\ndef read_lines(path):\n    with open(path) as handle:\n        "
SUFFIX = "\n\n\ndef main():\n    print(read_lines(os.sys.argv[1]))\n"


def say(out, *parts) -> None:
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    if out is not None:
        out.write(line + "\n")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def layer_check(out, device: str, skip_hf: bool) -> bool:
    cuda = device.startswith("cuda")
    model = fast_check.check_model(BIG if cuda else TINY, device)
    if cuda:
        fast, context = FastDiffusionGemma(model, max_len=2048, bucket=256, prefill_chunk=1024), 1124
    else:
        fast, context = FastDiffusionGemma(model, max_len=256, bucket=16, prefill_chunk=24), 40
    hf = None
    if not skip_hf:
        try:
            hf, _ = fast_check.transformers_view(model)
        except ImportError:
            say(out, "transformers not installed: fast path against our network only")
    say(out, f"experts kernel {fast.moe}, CUDA graphs {fast.use_graphs}")
    result = fast_check.check_fast(model, fast, context, hf)
    for line in result.lines:
        say(out, line)
    say(out, f"graphs in use after the check: {fast.use_graphs}, {len(fast._graphs)} captured")
    say(out, f"layer check {'PASSED' if result.ok else 'FAILED'}")
    return result.ok


def norm_check(out, device: str) -> bool:
    """The Triton RMSNorm against `ops.rms_norm_reference` (`fast_check.norm_mismatches`), for 0, 1 and 300
    rows of each width the 26B shape norms, and what one norm costs each way."""
    if not device.startswith("cuda") or not triton_norm.available():
        say(out, "rmsnorm kernel: not checked (needs CUDA and Triton)")
        return True
    mismatches = fast_check.norm_mismatches(
        device, (BIG["head_dim"], BIG["global_head_dim"], BIG["hidden_size"], 300), rows=(0, 1, 300)
    )
    for line in mismatches:
        say(out, f"   {line}")
    ok = not mismatches
    say(out, f"rmsnorm kernel against the reference: {'ok' if ok else 'MISMATCH'}")
    with torch.no_grad():  # what one norm of a step's shape costs, each way
        x = torch.randn(256, BIG["hidden_size"], device=device, dtype=torch.bfloat16)
        w = torch.ones(BIG["hidden_size"], device=device, dtype=torch.bfloat16)
        for name, fn in (("triton", triton_norm.rms_norm), ("reference", ops.rms_norm_reference)):
            for _ in range(3):
                fn(x, w, 1e-6)
            sync(device)
            start = time.perf_counter()
            for _ in range(200):
                fn(x, w, 1e-6)
            sync(device)
            say(
                out,
                f"  {name}: {(time.perf_counter() - start) / 200 * 1e6:.1f} us per [256, {x.shape[1]}] bf16 norm",
            )
    return ok


def fill(engine: Engine, request: FillRequest):
    steps: list[StepInfo] = []
    sync(str(engine.device))
    t0 = time.perf_counter()
    result = engine.fill(replace(request, on_step=steps.append))
    sync(str(engine.device))
    return result, steps, (time.perf_counter() - t0) * 1e3


def make_engine(folder: Path, device: str, fast: bool) -> Engine:
    """The server's engine on CUDA (`Engine.load`); on the CPU one without the CPU re-layout, whose int8
    products quantize activations per batch, so batched and row-by-row candidates could never agree."""
    if device.startswith("cuda"):
        # fp32, not the server's bf16: in bf16 the two backends' attention kernels round differently, and a
        # sampled token amplifies that over the steps until the texts part (seen 2026-11-28).
        return Engine.load(folder, device=device, fast=fast, dtype=torch.float32)
    model, settings = load_model(folder)
    return Engine(model, load_tokenizer(folder), settings, folder.name, False, folder, fast=fast)


def engine_check(out, device: str) -> bool:
    folder = Path(DEFAULT_MODEL_DIR)
    plain, fast = make_engine(folder, device, fast=False), make_engine(folder, device, fast=True)
    settings = replace(plain.settings, max_steps=12)
    requests = {
        "draft-line": dict(max_tokens=16, stop=("\n",), seed=0, settings=replace(settings, draft=True)),
        "healing": dict(prefix=PREFIX + "return hand", max_tokens=16, stop=("\n",), seed=1),
        "candidates": dict(
            max_tokens=32, candidates=3, seed=2, settings=replace(settings, window=0, draft=False)
        ),
        "skeleton": dict(middle=["lines = ", Hole(6), "\n        return ", Hole(4)], seed=3),
        "block": dict(max_tokens=128, seed=4, settings=replace(settings, draft=False)),
    }
    ok = True
    for name, fields in requests.items():
        request = FillRequest(**{"prefix": PREFIX, "suffix": SUFFIX, "settings": settings, **fields})
        for attempt in ("first", "again"):  # the first fast fill captures its graphs
            want, want_steps, plain_ms = fill(plain, request)
            got, got_steps, fast_ms = fill(fast, request)
            same_steps = [(s.step, s.token_ids, s.accepted_mask) for s in got_steps] == [
                (s.step, s.token_ids, s.accepted_mask) for s in want_steps
            ]
            same = same_steps and (got.text, got.steps, got.stop_reason) == (
                want.text,
                want.steps,
                want.stop_reason,
            )
            ok &= same
            say(
                out,
                f"{name} ({attempt}): {'same' if same else 'DIFFERENT'}; steps {got.steps}/{want.steps}, "
                f"{got.stop_reason}; fast {fast_ms:.0f} ms, plain {plain_ms:.0f} ms; text {got.text!r}",
            )
            if not same:
                say(out, f"   plain text {want.text!r}")
    backend = fast.fast_backend().fast
    say(
        out,
        f"engine's fast path: graphs {backend.use_graphs}, {len(backend._graphs)} captured, experts {backend.moe}",
    )
    say(out, f"engine check {'PASSED' if ok else 'FAILED'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "check_fast_gpu.txt"))
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of this script on a tiny shape")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device (--device cpu: a dry run of this script)")
        return 2
    with open(args.out, "w") as out:
        say(out, f"torch {torch.__version__}, device {args.device}")
        ok = layer_check(out, args.device, args.skip_hf)
        if args.device.startswith("cuda"):
            say(out, torch.cuda.get_device_name(0))
            torch.cuda.empty_cache()
        ok &= norm_check(out, args.device)
        ok &= engine_check(out, args.device)
        say(out, f"check_fast_gpu {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
