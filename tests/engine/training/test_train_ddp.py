"""Data-parallel training on CPU: two gloo processes, each with half a batch, take the same step as one
process with the whole batch, and agree on when to stop."""

from __future__ import annotations

import argparse
import os
import random
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from dfim.commands.train import add_arguments
from dfim.engine.model.tokenizer import Tokenizer
from dfim.engine.training.distributed import World, init_world
from dfim.engine.training.examples import Batch, Example, collate
from dfim.engine.training.objective import add_noise
from dfim.engine.training.run import setup
from dfim.engine.training.train import stop_reason, train_step

REPO = Path(__file__).resolve().parents[3]
TOKENIZER_JSON = REPO / "engine" / "weights" / "dfim-small" / "tokenizer.json"
BATCH, CONTEXT, CANVAS = 8, 48, 16
# float32 on CPU: the two ranks' partial sums reach the same gradient in another order, so it differs by
# rounding only. Parameters after one step compare within this absolute tolerance.
PARAM_ATOL = 2e-6
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-7


def parse(objective: str, out: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    extra = ["--causal-weight", "1.0", "--self-cond-p", "1.0"] if objective == "diffusion" else []
    args = parser.parse_args(
        ["--data", str(out), "--out", str(out), "--model-config", "tiny", "--objective", objective]
        + ["--lr", "1e-2", "--device", "cpu", "--workers", "0", *extra]
    )
    args.compile = False
    return args


def global_batch(tok: Tokenizer) -> tuple[Batch, torch.Tensor]:
    """A fixed batch of random FIM-shaped examples whose halves carry different loss weights (other
    middle lengths, other context lengths), and one noising of its canvas shared by every process."""
    rng = random.Random(0)
    examples = []
    for i in range(BATCH):
        n = rng.randint(8, CONTEXT - 4) if i < BATCH // 2 else rng.randint(4, 12)
        body = [rng.randrange(10, tok.vocab_size) for _ in range(n)]
        context = tok.fim_context(body[: n // 2], body[n // 2 :])
        middle_len = rng.randint(1, CANVAS - 1) if i < BATCH // 2 else rng.randint(1, 4)
        canvas = [rng.randrange(10, tok.vocab_size) for _ in range(middle_len)]
        canvas += [tok.eos_id] + [tok.pad_id] * (CANVAS - middle_len - 1)
        pinned = [j == 0 and i % 3 == 0 for j in range(CANVAS)]
        examples.append(Example(context, canvas, pinned, middle_len))
    batch = collate(examples, CONTEXT, tok.pad_id, 0.5)
    noisy, _ = add_noise(batch.canvas, batch.pinned, tok.vocab_size, 0.02, torch.Generator().manual_seed(1))
    return batch, noisy


def rows(batch: Batch, start: int, stop: int) -> Batch:
    return Batch(
        batch.context[start:stop],
        batch.context_pad[start:stop],
        batch.canvas[start:stop],
        batch.pinned[start:stop],
        batch.weight[start:stop],
    )


def one_step(objective: str, out: Path, world: World, part: slice) -> dict[str, torch.Tensor]:
    """The parameters and gradients after one training step on `part` of the global batch."""
    tok = Tokenizer.from_file(TOKENIZER_JSON)
    args = parse(objective, out)
    run = setup(args, out, tok, torch.device("cpu"), CANVAS, world)
    # Adam's first step is lr * sign(g): rounding in a near-zero gradient would flip a whole step. A large
    # eps makes the update smooth in g, so the comparison measures the gradients, not their rounding.
    for group in run.optimizer.param_groups:
        group["eps"] = 1e-3
    batch, noisy = global_batch(tok)
    train_step(run, rows(batch, part.start, part.stop), 1e-2, noisy[part])
    result = {f"param/{n}": p.detach().clone() for n, p in run.model.named_parameters()}
    # A parameter the step did not reach has no gradient in one process, zeros after the ranks' sum.
    grads = {n: torch.zeros_like(p) if p.grad is None else p.grad for n, p in run.model.named_parameters()}
    result.update({f"grad/{n}": g.clone() for n, g in grads.items()})
    return result


def worker(rank: int, port: int, objective: str, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    world, device = init_world("cpu")
    assert world == World(rank, 2, rank) and device.type == "cpu"
    half = BATCH // 2
    result = one_step(objective, Path(out), world, slice(rank * half, (rank + 1) * half))
    # Ranks agree on stopping: only rank 1's deadline has passed, and both stop at this step.
    tok = Tokenizer.from_file(TOKENIZER_JSON)
    run = setup(parse(objective, Path(out)), Path(out), tok, device, CANVAS, world)
    result["stop"] = torch.tensor([stop_reason(run, 0.0 if rank == 1 else float("inf"), 0.0) == "time"])
    from safetensors.torch import save_file

    save_file(result, str(Path(out) / f"rank{rank}.safetensors"))
    torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("objective", ["diffusion", "causal"])
def test_two_ranks_take_the_single_process_step(objective: str, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    mp.spawn(worker, args=(free_port(), objective, str(tmp_path)), nprocs=2, join=True)
    ranks = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(2)]
    assert all(bool(r.pop("stop")) for r in ranks), "a rank would step on alone"
    single = one_step(objective, tmp_path, World(), slice(0, BATCH))
    moved = 0
    for name, expected in single.items():
        for rank in ranks:
            if name.startswith("grad/"):
                torch.testing.assert_close(rank[name], expected, rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=name)
            else:
                torch.testing.assert_close(rank[name], expected, rtol=0, atol=PARAM_ATOL, msg=name)
        moved += int(name.startswith("grad/") and bool(expected.abs().sum() > 0))
    assert moved > len(single) // 4  # the step trained something: not a comparison of untouched weights
