"""Approximate CPU paths for one denoising step, measured and not adopted (docs/benchmarks.md, "Cheaper
steps by approximation"). Nothing in engine/ changes: each variant patches a loaded engine's model.

    head8     the LM head through fbgemm's dynamic int8 linear (int8 weights per output channel,
              activations quantized per tensor at run time, 7-bit range as AVX2 needs)
    layers8   every layer linear the same way: q/k/v (fused), o, gate/up (fused), down, the experts
    topkK     self-conditioning from the K most probable tokens: a gather of K embedding rows instead of
              the [L, V] x [V, H] product (not renormalised; the self-conditioning pre-norm would undo it)
    lrK_R     the K most probable tokens exactly, the rest of the distribution through a rank-R SVD
              of the embedding
    exact     the shipped path

Variants join with '+'. Modes: `time` (interleaved per-step CPU ms, 1 thread, ~1,100 cached tokens, as
scripts/bench_step_ab.py), `close` (logits against the exact path over 12 steps of one fill),
`dev` (scripts/dev_own_code.py's problems at --prefix-chars 1200 --suffix-chars 500, max 16 steps).

    python scripts/bench_step_approx.py time exact head8 layers8+head8 topk32
    python scripts/bench_step_approx.py close head8 layers8 topk32 lr64_32
    python scripts/bench_step_approx.py dev layers8+head8 [--seed-offset 1000]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import types
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from dfim.engine import Engine
from dfim.engine.api import FillRequest, SamplerSettings
from dfim.engine.evaluation.metrics import edit_similarity, exact_match
from dfim.engine.inference import sampler
from dfim.engine.inference.sampler_state import Constraints, DenoiseState
from dfim.engine.inference.sampler_steps import build_chain
from dfim.engine.model import network as M

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import dev_own_code  # noqa: E402


def pack(weight: Tensor):
    """[out, in] fp32 -> fbgemm's prepacked int8 weight, one scale per output channel."""
    w = weight.detach().float().contiguous()
    scale = (w.abs().amax(1) / 127.0).clamp(min=1e-12).double()
    zero = torch.zeros(w.shape[0], dtype=torch.long)
    return torch.ops.quantized.linear_prepack(
        torch.quantize_per_channel(w, scale, zero, 0, torch.qint8), None
    )


def int8(x: Tensor, packed) -> Tensor:
    return torch.ops.quantized.linear_dynamic(x, packed, True)


class Int8Linear(torch.nn.Module):
    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.packed = pack(weight)

    def forward(self, x: Tensor) -> Tensor:
        return int8(x, self.packed)


def head8(model) -> None:
    packed = pack(model.decoder.embed_tokens.weight)

    def logits(self, hidden: Tensor) -> Tensor:
        cap = self.config.final_logit_softcapping
        return int8(self.decoder.norm(hidden), packed).float().div_(cap).tanh_().mul_(cap)

    model.logits = types.MethodType(logits, model)


def layers8(model) -> None:
    for layer in model.decoder.layers:
        attn = layer.self_attn
        attn.project = make_project(attn, pack(attn.qkv.t()))
        attn.o_proj = Int8Linear(attn.o_proj.weight)
        layer.mlp.forward = make_mlp(pack(layer.mlp.gate_up.t()), pack(layer.mlp.down_proj.weight))
        layer.experts._sparse = make_experts(layer.experts)


def make_project(attn, qkv):
    def project(x: Tensor, cos: Tensor, sin: Tensor, rolled: bool = False):  # Attention.project, int8 q/k/v
        b, t, _ = x.shape
        hq, hkv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        fused = int8(x, qkv)
        q = fused[..., : hq * d].view(b, t, hq, d)
        k = fused[..., hq * d : (hq + hkv) * d].view(b, t, hkv, d)
        v = fused[..., (hq + hkv) * d :].view(b, t, hkv, d) if attn.v_proj is not None else k
        rope = M.apply_rolled_rope if rolled else M.apply_rope
        q, k, v = rope(attn.q_norm(q), cos, sin), rope(attn.k_norm(k), cos, sin), attn.v_norm(v)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    return project


def make_mlp(gate_up, down):
    def forward(x: Tensor) -> Tensor:
        gate, up = int8(x, gate_up).chunk(2, dim=-1)
        return int8(M.gelu(gate) * up, down)

    return forward


def make_experts(experts):
    gate_up = [pack(experts.gate_up_proj[e]) for e in range(experts.num_experts)]
    down = [pack(experts.down_proj[e]) for e in range(experts.num_experts)]

    def sparse(x: Tensor, weights: Tensor, index: Tensor) -> Tensor:  # Experts._sparse, int8 products
        out = torch.zeros_like(x)
        order = index.reshape(-1).argsort()
        counts = torch.bincount(index.reshape(-1), minlength=experts.num_experts).tolist()
        token_of_slot, weight_of_slot = order // index.shape[1], weights.reshape(-1)[order]
        start = 0
        for e, count in enumerate(counts):
            if count:
                tokens = token_of_slot[start : start + count]
                gate, up = int8(x[tokens], gate_up[e]).chunk(2, dim=-1)
                y = int8(M.gelu(gate) * up, down[e])
                out.index_add_(0, tokens, y * weight_of_slot[start : start + count, None])
                start += count
        return out

    return sparse


def sparse_self_conditioning(model, k: int, rank: int = 0) -> None:
    weight = model.decoder.embed_tokens.weight.detach()
    rows = weight.contiguous()  # row-major: the CPU path stores the embedding transposed (slow gathers)
    if rank:
        u, s, vh = torch.linalg.svd(weight.double(), full_matrices=False)
        left, right = (u[:, :rank] * s[:rank]).float().contiguous(), vh[:rank].float().contiguous()

    def canvas_embeddings(self, canvas_ids: Tensor, self_cond_logits: Tensor | None) -> Tensor:
        decoder = self.decoder
        x = decoder.embed(canvas_ids)
        if self_cond_logits is None:
            return decoder.self_conditioning(x, torch.zeros_like(x))
        probs = self_cond_logits.softmax(dim=-1, dtype=torch.float32)
        top, index = probs.topk(k, dim=-1)
        soft = torch.matmul(top.unsqueeze(-2), F.embedding(index, rows)).squeeze(-2)
        if rank:
            soft = soft + (probs.scatter_(-1, index, 0.0) @ left) @ right
        return decoder.self_conditioning(x, soft * torch.tensor(decoder.embed_scale, dtype=x.dtype))

    model.canvas_embeddings = types.MethodType(canvas_embeddings, model)


def apply(model, spec: str) -> None:
    for part in spec.split("+"):
        if part == "head8":
            head8(model)
        elif part == "layers8":
            layers8(model)
        elif part.startswith("topk"):
            sparse_self_conditioning(model, int(part[4:]))
        elif part.startswith("lr"):
            k, rank = part[2:].split("_")
            sparse_self_conditioning(model, int(k), int(rank))
        elif part != "exact":
            raise SystemExit(f"unknown variant {part!r}")


def step_state(engine: Engine, length: int) -> DenoiseState:
    rules = Constraints.build(
        torch.zeros(length, dtype=torch.bool),
        torch.zeros(length, dtype=torch.long),
        vocab_size=engine.vocab_size,
        eos_id=engine.tokenizer.eos_id,
        pad_id=engine.tokenizer.pad_id,
        banned=engine.banned,
        no_end=torch.zeros(length, dtype=torch.bool),
    )
    return sampler.new_state(1, rules, generator=torch.Generator().manual_seed(0))


def time_steps(engine: Engine, models: dict, repeats: int) -> None:
    ids = engine.tokenizer.encode((ROOT / "engine" / "inference" / "sampler.py").read_text() * 2)[:1100]
    chain = build_chain(SamplerSettings(max_steps=10**6, early_stop=False))  # never stops: every step alike
    cache = engine.model.new_cache()
    engine.model.encode(torch.tensor([ids]), cache)  # all variants share the exact cache
    print(f"threads {torch.get_num_threads()}, context {len(ids)}")
    print("| canvas | variant | CPU ms per step | wall ms | speed-up (CPU) |\n|---|---|---|---|---|")
    for length in (16, 32):
        steps = {}
        for spec, model in models.items():
            state = step_state(engine, length)

            def step(state=state, model=model) -> None:
                sampler.denoise_step(state, chain, model.denoise(state.canvas, cache, state.self_cond))

            step()  # sets self_cond, as in a fill
            steps[spec] = step
        cpu: dict[str, list[float]] = {k: [] for k in steps}
        wall: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(repeats):
            for spec, step in steps.items():
                c, w = time.process_time(), time.perf_counter()
                step()
                cpu[spec].append((time.process_time() - c) * 1000)
                wall[spec].append((time.perf_counter() - w) * 1000)
        base = statistics.median(next(iter(cpu.values())))
        for spec in steps:
            c = statistics.median(cpu[spec])
            print(
                f"| {length} | {spec} | {c:.1f} | {statistics.median(wall[spec]):.1f} | {base / c:.2f}x |",
                flush=True,
            )


def closeness(engine: Engine, models: dict) -> None:
    ids = engine.tokenizer.encode((ROOT / "engine" / "inference" / "fill.py").read_text())[:1100]
    chain = build_chain(SamplerSettings(max_steps=10**6, early_stop=False))
    exact = engine.model
    cache = exact.new_cache()
    exact.encode(torch.tensor([ids]), cache)
    state, inputs = step_state(engine, 32), []
    for _ in range(12):  # the exact path's own inputs, step by step
        inputs.append((state.canvas.clone(), None if state.self_cond is None else state.self_cond.clone()))
        sampler.denoise_step(state, chain, exact.denoise(state.canvas, cache, state.self_cond))
    for spec, model in models.items():
        worst, agree, kl = 0.0, [], []
        for canvas, self_cond in inputs:
            a, b = exact.denoise(canvas, cache, self_cond), model.denoise(canvas, cache, self_cond)
            worst = max(worst, float((a - b).abs().max()))
            agree.append(float((a.argmax(-1) == b.argmax(-1)).float().mean()))
            kl.append(
                float(
                    F.kl_div(b.log_softmax(-1), a.log_softmax(-1), log_target=True, reduction="none")
                    .sum(-1)
                    .mean()
                )
            )
        print(
            f"{spec}: max |logit diff| {worst:.3f}, argmax agrees {statistics.mean(agree):.3f}, mean KL {statistics.mean(kl):.1e}"
        )


def dev(specs: list[str], seed_offset: int, limit: int | None) -> None:
    for spec in specs:
        engine = Engine.load(threads=1)  # a fresh engine per variant: no context cache carried over
        with torch.no_grad():
            apply(engine.model, spec)  # in place: the context is encoded by the variant too
        settings = replace(engine.settings, max_steps=16)
        em, es, steps = [], [], []
        for i, p in enumerate(dev_own_code.problems()[:limit]):
            request = FillRequest(
                p["prefix"][-1200:],
                p["suffix"][:500],
                max_tokens=32,
                seed=seed_offset + i,
                settings=settings,
                stop=("\n",),
            )
            result = engine.fill(request)
            em.append(exact_match(result.text, p["want"]))
            es.append(edit_similarity(result.text, p["want"]))
            steps.append(result.steps)
        print(
            f"{spec}: {len(em)} problems, EM {100 * statistics.mean(em):.1f}% ES {statistics.mean(es):.1f} "
            f"steps {statistics.mean(steps):.2f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("time", "close", "dev"))
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--limit", type=int, default=None, help="dev: the first N problems (all 221 by default)"
    )
    parser.add_argument("--seed-offset", type=int, default=0, help="dev: seeds offset+0.. (another sample)")
    args = parser.parse_args()
    if args.mode == "dev":
        dev(args.variants, args.seed_offset, args.limit)
        return
    engine = Engine.load(threads=1)
    models = {}
    for spec in args.variants:
        models[spec] = copy.deepcopy(engine.model) if spec != "exact" else engine.model
        with torch.no_grad():
            apply(models[spec], spec)
    with torch.inference_mode():
        if args.mode == "time":
            time_steps(engine, models, args.repeats)
        else:
            closeness(engine, models)


if __name__ == "__main__":
    main()
