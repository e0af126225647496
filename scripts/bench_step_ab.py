"""Before/after CPU cost of one denoising step: engine/model/network.py and engine/inference/sampler.py of a git revision
against the working tree, in one process, interleaved step by step.

On a shared machine two separate runs measure the neighbours as much as the code; interleaving the two
versions and reading process CPU time (1 thread) keeps the comparison fair. The old modules are read
with `git show REV:path` and get the same weights and the same ~1,100-token cached context.

    python scripts/bench_step_ab.py --base 8216a07 [--threads 1] [--repeats 25]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from dfim.engine import Engine
from dfim.engine.api import SamplerSettings
from dfim.engine.inference import sampler as new_sampler
from dfim.engine.inference.sampler_state import Constraints
from dfim.engine.inference.sampler_steps import build_chain

ROOT = Path(__file__).resolve().parents[1]


def module_at(rev: str, path: str, name: str, folder: Path) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    file = folder / f"{name}.py"
    file.write_bytes(source)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def step_of(
    smod: ModuleType, engine: Engine, length: int, settings: SamplerSettings
) -> tuple[Any, Callable[[torch.Tensor], None]]:
    """(state, advance(logits)) for one canvas row over `smod`: the sampler of this tree or of a revision
    before the chain took constraints and a built chain (`new_state(..., settings=...)`,
    `denoise_step(state, settings, logits)`)."""
    pinned, pin_ids = torch.zeros(length, dtype=torch.bool), torch.zeros(length, dtype=torch.long)
    generator = torch.Generator().manual_seed(0)
    common = dict(
        vocab_size=engine.vocab_size, eos_id=engine.tokenizer.eos_id, pad_id=engine.tokenizer.pad_id
    )
    no_end = torch.zeros(length, dtype=torch.bool)
    if "rules" not in inspect.signature(smod.new_state).parameters:  # the old interface
        state = smod.new_state(
            1,
            pinned,
            pin_ids,
            **common,
            settings=settings,
            generator=generator,
            banned=engine.banned,
            no_end=no_end,
        )
        return state, lambda logits: smod.denoise_step(state, settings, logits)
    rules = Constraints.build(pinned, pin_ids, **common, banned=engine.banned, no_end=no_end)
    state, chain = smod.new_state(1, rules, generator=generator), build_chain(settings)
    return state, lambda logits: smod.denoise_step(state, chain, logits)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--context", type=int, default=1100)
    args = parser.parse_args()
    engine = Engine.load(threads=args.threads)
    new = engine.model
    with tempfile.TemporaryDirectory() as tmp:
        old_model = module_at(args.base, "engine/model/network.py", "base_model", Path(tmp))
        old_sampler = module_at(args.base, "engine/inference/sampler.py", "base_sampler", Path(tmp))
    old = old_model.DiffusionGemma(new.config).eval()
    old.load_state_dict({k: v.contiguous() for k, v in new.state_dict().items()})
    ids = engine.tokenizer.encode((ROOT / "engine" / "inference" / "sampler.py").read_text() * 2)[
        : args.context
    ]
    print(f"base {args.base} vs working tree, threads {torch.get_num_threads()}, context {len(ids)}")
    print("| canvas | base CPU ms/step | now | speed-up | base wall | now wall |")
    print("|---|---|---|---|---|---|")
    with torch.inference_mode():
        caches = {"base": old.new_cache(), "now": new.new_cache()}
        old.encode(torch.tensor([ids]), caches["base"])
        new.encode(torch.tensor([ids]), caches["now"])
        settings = SamplerSettings(max_steps=10**6, early_stop=False)  # never stops: every step alike
        for length in (16, 32, 64):
            steps = {}
            for key, model, smod in (("base", old, old_sampler), ("now", new, new_sampler)):
                state, advance = step_of(smod, engine, length, settings)
                cache = caches[key]

                def step(state=state, model=model, advance=advance, cache=cache) -> None:
                    advance(model.denoise(state.canvas, cache, state.self_cond))

                step()  # sets self_cond, as in a fill
                steps[key] = step
            cpu: dict[str, list[float]] = {k: [] for k in steps}
            wall: dict[str, list[float]] = {k: [] for k in steps}
            for _ in range(args.repeats):
                for key, step in steps.items():
                    c, w = time.process_time(), time.perf_counter()
                    step()
                    cpu[key].append((time.process_time() - c) * 1000)
                    wall[key].append((time.perf_counter() - w) * 1000)
            b, n = statistics.median(cpu["base"]), statistics.median(cpu["now"])
            print(
                f"| {length} | {b:.1f} | {n:.1f} | {b / n:.2f}x | {statistics.median(wall['base']):.1f} "
                f"| {statistics.median(wall['now']):.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
